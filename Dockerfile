# nvidia-device-plugin (Python). `make image` (plain `docker build`, no BuildKit needed), or for amd64 and
# arm64 at once `make image-multiarch IMAGE=<registry>/nvidia-device-plugin-py PLATFORMS=linux/amd64,linux/arm64`.
#
# Two stages: the builder installs this source tree and its pinned dependencies into a virtual environment;
# the runtime stage copies that environment and nothing else (no compiler, no source tree, no pip cache).
# Only Dockerfile syntax that the classic builder understands is used, so no frontend image is pulled.
#
# THE BASE IMAGE IS PINNED BY TAG ONLY; PIN IT BY DIGEST BEFORE A PRODUCTION BUILD. To pin or bump it:
#   docker buildx imagetools inspect python:3.12-slim-bookworm     # prints "Digest: sha256:<64 hex>"
# and set the default below to python:3.12-slim-bookworm@sha256:<that digest> (the digest of the multi-arch
# index, so one pin serves amd64 and arm64), then pass the same digest as BASE_DIGEST. Renovate or
# Dependabot can keep tag and digest bumped together. The default is not pinned here because the digest
# could not be looked up where this file was written, and a made-up digest would fail every build.
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md LICENSE ./
COPY nvidia_device_plugin ./nvidia_device_plugin
# The project and every dependency at the versions pyproject.toml pins, into one self-contained venv.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-compile . \
    && /opt/venv/bin/nvidia-device-plugin --version \
    && /opt/venv/bin/config-manager --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
# ARGs declared before the first FROM are not visible inside a stage unless declared again here; without
# this, the base.name label below would be empty.
ARG PYTHON_IMAGE
ARG BASE_DIGEST=""
ARG VERSION=dev
ARG REVISION=unknown
# The repository URL; `make image` passes `git remote get-url origin`.
ARG SOURCE=""
LABEL org.opencontainers.image.title="nvidia-device-plugin-py" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs (whole GPUs, time-slicing, MPS, MIG), compatible with NVIDIA's version: v1 config, with config-manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"
# PROMETHEUS_DISABLE_CREATED_SERIES: prometheus_client would add a `_created` series next to every counter;
# scrapers do not need them. NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES ask the NVIDIA container
# runtime (or its CDI hook) to inject the driver library (libnvidia-ml.so.1), the MPS control binary and the
# /dev/nvidia* nodes: NVML needs them, and this image ships none of them.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PROMETHEUS_DISABLE_CREATED_SERIES=True \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=builder /opt/venv /opt/venv
COPY LICENSE /licenses/LICENSE
# Runs as root (UID 0) on purpose, with every Linux capability dropped by the DaemonSet. kubelet's
# /var/lib/kubelet/device-plugins is owned by root (mode 0750 or 0755 depending on the distribution) and
# kubelet.sock is a root-owned socket writable by its owner only: another UID cannot create its socket there
# or connect to kubelet. UID 0 without CAP_DAC_OVERRIDE gets exactly the owner's permissions on those root-owned
# paths and nothing more. docs/operations.md explains the full security context. The config-manager
# containers of overlays/node-labels run as 65534 instead (securityContext in the manifest).
USER 0:0
# `config-manager` (the GPU Operator runs it from this image) is on PATH next to nvidia-device-plugin.
ENTRYPOINT ["nvidia-device-plugin"]
CMD ["run"]
