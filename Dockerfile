# syntax=docker/dockerfile:1
#
# nvidia-device-plugin (Python): `make image`, or
#   docker build --build-arg VERSION=0.1.0 -t nvidia-device-plugin-py:0.1.0 .
#
# Two stages: the builder turns this source tree and its pinned dependencies into wheels; the runtime
# stage installs those wheels and nothing else (no compiler, no source tree, no pip cache).
#
# The base image is pinned by tag. For reproducible production builds pin it by digest as well, e.g.
#   FROM python:3.11.11-slim-bookworm@sha256:<digest>
# (`docker buildx imagetools inspect python:3.11.11-slim-bookworm` prints the digest), and let a bot such
# as Renovate or Dependabot bump tag and digest together.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY nvidia_device_plugin ./nvidia_device_plugin
# One wheel for this project and one for every dependency, at the versions pyproject.toml pins.
RUN pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=dev
LABEL org.opencontainers.image.title="nvidia-device-plugin-py" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs (whole GPUs, time-slicing, MPS, MIG), compatible with NVIDIA's version: v1 config" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# PROMETHEUS_DISABLE_CREATED_SERIES: prometheus_client would add a `_created` series next to every counter;
# scrapers do not need them. NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES ask the NVIDIA container
# runtime (or its CDI hook) to inject the driver library (libnvidia-ml.so.1), the MPS control binary and the
# /dev/nvidia* nodes: NVML needs them, and this image ships none of them.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PROMETHEUS_DISABLE_CREATED_SERIES=True \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels nvidia-device-plugin \
    && nvidia-device-plugin --version
# Runs as root (UID 0) on purpose, with every Linux capability dropped by the DaemonSet. kubelet's
# /var/lib/kubelet/device-plugins is owned by root (mode 0750 or 0755 depending on the distribution) and
# kubelet.sock is a root-owned socket writable by its owner only: another UID cannot create its socket there
# or connect to kubelet. UID 0 without CAP_DAC_OVERRIDE gets exactly the owner's permissions on those root-owned
# paths and nothing more. docs/operations.md explains the full security context.
USER 0:0
ENTRYPOINT ["nvidia-device-plugin"]
CMD ["run"]
