# Orchard Env orchestrator: `orchard env serve`, run by infra/k8s (Deployment orchard-orchestrator)
# with the kubernetes backend and the Redis store. Non-root (uid 10001), no writes outside /tmp.
#
# Build from the repository root (BuildKit reads orchestrator.Dockerfile.dockerignore next to this file):
#   docker build -f infra/images/orchestrator.Dockerfile -t ghcr.io/orchard-ai/orchard-orchestrator:0.1.0 .
#
# The kubernetes backend needs the `k8s` extra (the official client) besides `env` and `redis`.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/orchard
WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchard ./orchard
RUN /opt/orchard/bin/pip install ".[env,redis,k8s]"

FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 orchard \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin orchard
COPY --from=build /opt/orchard /opt/orchard
ENV PATH=/opt/orchard/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 8700
ENTRYPOINT ["orchard", "env", "serve"]
CMD ["--host", "0.0.0.0", "--port", "8700"]
