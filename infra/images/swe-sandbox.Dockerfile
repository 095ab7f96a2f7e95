# Base image for SWE task sandboxes: Python 3.11, git, patch, a C toolchain and pytest, a non-root
# user `app` (uid 1000) and /workspace. Task images build FROM it and add their repository; the
# kubernetes backend keeps the image's env and workdir and overrides only the command (the agent).
# Single stage on purpose: everything installed here is wanted at run time.
#
# Build from the repository root:
#   docker build -f infra/images/swe-sandbox.Dockerfile -t ghcr.io/orchard-ai/orchard-swe-base:0.1.0 .
# It is then the `swe-base` image in the backend config (infra/k8s/*/backend-config.yaml).
FROM python:3.11.13-slim-bookworm
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
# Debian's stable packages: no version pins.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends git patch build-essential ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN pip install "pytest==9.2.0"
RUN groupadd --gid 1000 app \
 && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash app \
 && mkdir -p /workspace \
 && chown app:app /workspace
WORKDIR /workspace
USER 1000:1000
# Replaced by the agent when the backend starts a sandbox; keeps `docker run` of the image alive.
CMD ["sleep", "infinity"]
