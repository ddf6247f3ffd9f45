# nvidia-device-plugin (Python). `make image` builds it with docker (classic builder or BuildKit), `make
# image-test` with Debian's buildah on a Debian base made locally, and runs it.
#
# Two stages. The builder makes a venv at /opt/venv holding this project's wheel and exactly the dependencies
# pinned in image/requirements.lock (the whole closure), built with the tools pinned in
# image/build-requirements.lock; the runtime stage copies that venv and nothing else: no pip, setuptools or
# wheel in it, no bytecode from the builder, no source tree, no cache. Only instructions the classic builder
# knows are used (no `# syntax=` line, no RUN --mount), so no frontend image is pulled.
#
# Build arguments, none of which needs an edit of this file:
#   BASE_IMAGE            the base of both stages: any Debian-like image with python3 (>= 3.11) and its venv
#                         module. The default is Docker Hub's; where no public registry is reachable, make one
#                         locally as `make image-test` does (image/make-base.sh) and pass its name.
#                         PIN IT BY DIGEST FOR PRODUCTION: `docker buildx imagetools inspect <image>` prints
#                         "Digest: sha256:<64 hex>"; pass BASE_IMAGE=<image>@sha256:<digest> and the same
#                         BASE_DIGEST=sha256:<digest> (recorded in the org.opencontainers.image.base.digest label).
#   PIP_INDEX             a package index to use instead of PyPI (a mirror, a private index)
#   PIP_EXTRA_INDEX       a second index pip also reads
#   PIP_CA_BUNDLE         PEM text of CA certificates pip must trust besides the base's (a TLS-intercepting
#                         proxy, a private index): --build-arg PIP_CA_BUNDLE="$(cat corp-ca.pem)"
# These four are used in the builder stage only; the runtime stage declares none of them, so neither an index
# URL (which may hold a token) nor a CA appears in the image or its history.
ARG BASE_IMAGE=python:3.12-slim-bookworm

FROM ${BASE_IMAGE} AS builder
ARG PIP_INDEX=""
ARG PIP_EXTRA_INDEX=""
ARG PIP_CA_BUNDLE=""
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY image/build-requirements.lock image/requirements.lock image/
COPY pyproject.toml setup.cfg README.md LICENSE ./
COPY nvidia_device_plugin ./nvidia_device_plugin
# /opt/build: the build tools. /opt/venv: created without pip; the build tools' pip installs into it
# (--python), --no-deps from the lock, and the check below fails the build if anything is missing or unpinned.
RUN set -eu; \
    if [ -n "$PIP_CA_BUNDLE" ]; then \
        cat /etc/ssl/certs/ca-certificates.crt > /tmp/ca.pem 2>/dev/null || true; \
        printf '%s\n' "$PIP_CA_BUNDLE" >> /tmp/ca.pem; \
        export PIP_CERT=/tmp/ca.pem; \
    fi; \
    if [ -n "$PIP_INDEX" ]; then export PIP_INDEX_URL="$PIP_INDEX"; fi; \
    if [ -n "$PIP_EXTRA_INDEX" ]; then export PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX"; fi; \
    python3 -m venv /opt/build; \
    /opt/build/bin/python -m pip install --quiet --no-compile -r image/build-requirements.lock; \
    /opt/build/bin/python -m pip wheel --quiet --no-build-isolation --no-deps --wheel-dir /tmp/wheels .; \
    python3 -m venv --without-pip /opt/venv; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python install --quiet --no-compile --no-deps \
        -r image/requirements.lock /tmp/wheels/nvidia_device_plugin-*.whl; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python check; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python freeze --exclude nvidia-device-plugin \
        | sort > /tmp/installed; \
    grep -v '^#' image/requirements.lock | sort > /tmp/locked; \
    if ! cmp -s /tmp/installed /tmp/locked; then \
        echo "the venv is not image/requirements.lock:"; diff /tmp/locked /tmp/installed; exit 1; \
    fi; \
    /opt/venv/bin/nvidia-device-plugin --version; \
    /opt/venv/bin/config-manager --help > /dev/null; \
    find /opt/venv -name __pycache__ -prune -exec rm -rf {} +; \
    rm -rf /tmp/wheels /tmp/ca.pem

FROM ${BASE_IMAGE} AS runtime
# ARGs declared before the first FROM are not visible inside a stage unless declared again here; without
# this, the base.name label below would be empty.
ARG BASE_IMAGE
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
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}"
# PROMETHEUS_DISABLE_CREATED_SERIES: prometheus_client would add a `_created` series next to every counter;
# scrapers do not need them. NVIDIA_VISIBLE_DEVICES / NVIDIA_DRIVER_CAPABILITIES ask the NVIDIA container
# runtime (or its CDI hook) to inject the driver library (libnvidia-ml.so.1), the MPS control binary and the
# /dev/nvidia* nodes: NVML needs them, and this image ships none of them. PYTHONDONTWRITEBYTECODE: the root
# filesystem is read-only in the DaemonSets.
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
# containers run as 65534 instead (the chart's configManager.securityContext).
USER 0:0
# `config-manager` (the GPU Operator runs it from this image) and `gpu-feature-discovery` are on PATH too.
ENTRYPOINT ["nvidia-device-plugin"]
CMD ["run"]
