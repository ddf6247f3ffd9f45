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
#                         module. The default is Docker Hub's python:3.12-slim-bookworm pinned by its digest
#                         (below); where no public registry is reachable, make one locally as `make image-test`
#                         does (image/make-base.sh) and pass its name. To move the pin: `skopeo inspect
#                         docker://python:3.12-slim-bookworm` (or `docker buildx imagetools inspect`) prints the
#                         index digest; set it here and in BASE_DIGEST below, together.
#   BASE_DIGEST           the base's digest, recorded in the org.opencontainers.image.base.digest label; pass
#                         the matching one (or "") with another BASE_IMAGE.
#   VENDOR, MAINTAINER, RELEASE   the OpenShift labels (vendor, maintainer, release): whoever builds and ships
#                         the image sets them to themselves and their build number.
#   PIP_INDEX             a package index to use instead of PyPI (a mirror, a private index)
#   PIP_EXTRA_INDEX       a second index pip also reads
#   PIP_CA_BUNDLE         PEM text of CA certificates pip must trust besides the base's (a TLS-intercepting
#                         proxy, a private index): --build-arg PIP_CA_BUNDLE="$(cat corp-ca.pem)"
# These four are used in the builder stage only; the runtime stage declares none of them, so neither an index
# URL (which may hold a token) nor a CA appears in the image or its history.
# python:3.12-slim-bookworm pinned by digest (the tag's multi-platform index: amd64 and arm64 resolve from it).
ARG BASE_IMAGE=python:3.12-slim-bookworm@sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254
ARG BASE_DIGEST=sha256:782412e85d0f0984994c290652577d4018aff08145c85b262bb63dc0c7522254

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
# --require-hashes: every file pip takes from an index must have one of the lock's sha256 (image/hash_lock.py
# writes them); the project's own wheel, built just above, is installed from the local file (--no-index).
# Bytecode: the DaemonSets' root filesystem is read-only, so without .pyc files every start of every program
# compiles each module it imports (in the image, the daemon's imports took 280-390 ms instead of 130-180, the
# kubernetes client's 440-600 instead of 170-200). The builder's own bytecode (from the runs below) is removed,
# then compileall writes all of it once, as unchecked-hash .pyc: no timestamp in them, and Python does not
# re-read the source to check them (nothing in the image changes). Beside it, the compiled methods of the
# package's dataclasses (nvidia_device_plugin/base/dataclass_code.py), which Python caches nowhere itself,
# written from / so that it is the installed package's (in /src, `-m` would find the source tree's).
RUN set -eu; \
    if [ -n "$PIP_CA_BUNDLE" ]; then \
        cat /etc/ssl/certs/ca-certificates.crt > /tmp/ca.pem 2>/dev/null || true; \
        printf '%s\n' "$PIP_CA_BUNDLE" >> /tmp/ca.pem; \
        export PIP_CERT=/tmp/ca.pem; \
    fi; \
    if [ -n "$PIP_INDEX" ]; then export PIP_INDEX_URL="$PIP_INDEX"; fi; \
    if [ -n "$PIP_EXTRA_INDEX" ]; then export PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX"; fi; \
    python3 -m venv /opt/build; \
    /opt/build/bin/python -m pip install --quiet --no-compile --require-hashes -r image/build-requirements.lock; \
    /opt/build/bin/python -m pip wheel --quiet --no-build-isolation --no-deps --wheel-dir /tmp/wheels .; \
    python3 -m venv --without-pip /opt/venv; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python install --quiet --no-compile --no-deps \
        --require-hashes -r image/requirements.lock; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python install --quiet --no-compile --no-deps \
        --no-index /tmp/wheels/nvidia_device_plugin-*.whl; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python check; \
    /opt/build/bin/python -m pip --python /opt/venv/bin/python freeze --exclude nvidia-device-plugin \
        | sort > /tmp/installed; \
    sed -n 's/^\([A-Za-z0-9][^ =]*==[^ ]*\).*/\1/p' image/requirements.lock | sort > /tmp/locked; \
    if ! cmp -s /tmp/installed /tmp/locked; then \
        echo "the venv is not image/requirements.lock:"; diff /tmp/locked /tmp/installed; exit 1; \
    fi; \
    /opt/venv/bin/nvidia-device-plugin --version; \
    /opt/venv/bin/config-manager --help > /dev/null; \
    find /opt/venv -name __pycache__ -prune -exec rm -rf {} +; \
    /opt/venv/bin/python -m compileall -q -j 0 --invalidation-mode unchecked-hash /opt/venv/lib > /dev/null; \
    (cd / && /opt/venv/bin/python -m nvidia_device_plugin.base.dataclass_code > /dev/null); \
    rm -rf /tmp/wheels /tmp/ca.pem

FROM ${BASE_IMAGE} AS runtime
# ARGs declared before the first FROM are not visible inside a stage unless declared again here; without
# this, the base.name label below would be empty.
ARG BASE_IMAGE
ARG BASE_DIGEST
ARG VERSION=dev
ARG REVISION=unknown
# The repository URL; `make image` passes `git remote get-url origin`.
ARG SOURCE=""
ARG VENDOR="nvidia-device-plugin-py maintainers"
ARG MAINTAINER="nvidia-device-plugin-py maintainers"
ARG RELEASE="1"
# The OCI labels, and those OpenShift (and its certification) reads, as NVIDIA's image carries them: name,
# vendor, version, release, summary, description, io.k8s.display-name, io.k8s.description, maintainer.
LABEL org.opencontainers.image.title="nvidia-device-plugin-py" \
      org.opencontainers.image.description="Kubernetes device plugin for NVIDIA GPUs (whole GPUs, time-slicing, MPS, MIG), compatible with NVIDIA's version: v1 config, with config-manager" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.vendor="${VENDOR}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_IMAGE}" \
      org.opencontainers.image.base.digest="${BASE_DIGEST}" \
      name="nvidia-device-plugin-py" \
      vendor="${VENDOR}" \
      version="${VERSION}" \
      release="${RELEASE}" \
      summary="Kubernetes device plugin for NVIDIA GPUs (Python)" \
      description="Advertises NVIDIA GPUs to kubelet (whole GPUs, time-slicing, MPS, MIG, CDI, DRA), with config-manager and gpu-feature-discovery; takes NVIDIA's k8s-device-plugin v0.20 config" \
      io.k8s.display-name="NVIDIA Device Plugin (Python)" \
      io.k8s.description="Advertises NVIDIA GPUs to kubelet (whole GPUs, time-slicing, MPS, MIG, CDI, DRA), with config-manager and gpu-feature-discovery; takes NVIDIA's k8s-device-plugin v0.20 config" \
      maintainer="${MAINTAINER}"
# kmod (lsmod): the GPU Operator's device-plugin entrypoint runs `lsmod` to detect the GDS (nvidia_fs) and
# GDRCopy (gdrdrv) modules. The only thing the runtime stage runs; the apt lists and logs are removed with it.
RUN set -eu; \
    if ! command -v lsmod > /dev/null; then \
        apt-get update -qq; \
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kmod > /dev/null; \
        rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log; \
    fi; \
    command -v lsmod > /dev/null
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
