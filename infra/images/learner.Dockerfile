# The JAX learner for the Orchard-SWE recipe on TPU: `python experiments/swe_bar/run.py` with the
# repository's configs, run by the JobSet in infra/gke/manifests/learner-jobset.yaml. The learner
# drives the whole recipe: rollouts on the vLLM server, sandboxes on Orchard Env, BAR RL updates.
#
# Build from the repository root (BuildKit reads learner.Dockerfile.dockerignore next to this file):
#   docker build -f infra/images/learner.Dockerfile -t ghcr.io/orchard-ai/orchard-learner:0.1.0 .
#
# JAX_EXTRA picks the accelerator: `tpu` (default; jax[tpu] pulls libtpu from PyPI), `cuda12` for
# GPUs, or `cpu`. JAX_VERSION must match the jax the project is tested with. The GPU learner
# (infra/gke/manifests/learner-jobset-gpu.yaml) runs the CUDA build, tagged apart:
#   docker build -f infra/images/learner.Dockerfile --build-arg JAX_EXTRA=cuda12 -t ghcr.io/orchard-ai/orchard-learner:0.1.0-cuda12 .
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG JAX_VERSION=0.10.2
ARG JAX_EXTRA=tpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/orchard
WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchard ./orchard
RUN /opt/orchard/bin/pip install ".[train,env]" "jax[${JAX_EXTRA}]==${JAX_VERSION}"

FROM ${PYTHON_IMAGE}
COPY --from=build /opt/orchard /opt/orchard
COPY configs /app/configs
COPY experiments /app/experiments
ENV PATH=/opt/orchard/bin:$PATH PYTHONUNBUFFERED=1
# Relative paths in the config (data/, checkpoints/, runs/) resolve against the working directory,
# which the JobSet points at the shared volume.
WORKDIR /work
# Root on purpose: TPU device nodes (/dev/accel*, /dev/vfio) are root-owned on GKE TPU nodes.
ENTRYPOINT ["python", "/app/experiments/swe_bar/run.py"]
CMD ["--config=/app/configs/swe_bar.py:qwen3_30b_a3b", "--workdir=runs/swe_bar_qwen3_30b_a3b"]
