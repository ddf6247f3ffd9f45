#!/usr/bin/env bash
# `make image-test`: build the image with a real engine and run it under the DaemonSet's security context.
#   1. podman, buildah, mmdebstrap and runc from Debian (apt-get) if any is missing;
#   2. the base made locally (image/make-base.sh: no container registry needed);
#   3. the image built with buildah --no-cache (image/build-image.sh, which `make release` builds with too);
#   4. tests/deploy/test_image.py run against it (kubelet stand-in, --simulate, no GPU).
# Each step is bounded and a failure names the step. Measurements land in $REPORT (default
# build/image-test.json): image size, start-to-registered, kubelet-restart-to-registered, SIGTERM-to-exit.
# Environment: PYTHON (the test venv's python), IMAGE_TAG, BASE_IMAGE (skip step 2 with your own base),
# PIP_INDEX / PIP_EXTRA_INDEX / PIP_CA_FILE (passed to the build, image/build-image.sh says how).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
IMAGE_TAG=${IMAGE_TAG:-localhost/nvidia-device-plugin-py:image-test}
REPORT=${REPORT:-build/image-test.json}
RUNTIME=runc  # crun refuses this kind of hybrid-cgroup host; runc runs there

step() { echo "== image-test: $*"; }
fail() { echo "image-test FAILED at: $*" >&2; exit 1; }
bounded() { local seconds=$1 what=$2; shift 2; timeout --kill-after=10 "$seconds" "$@" || fail "$what (exit $?, limit ${seconds}s)"; }

missing=()
for tool in podman buildah mmdebstrap runc; do command -v "$tool" > /dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
    step "installing ${missing[*]} from Debian"
    sudo=""; [ "$(id -u)" = 0 ] || sudo="sudo"
    bounded 300 "apt-get update" $sudo apt-get update -qq
    bounded 600 "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive \
        $sudo apt-get install -y -qq --no-install-recommends podman buildah mmdebstrap runc uidmap > /dev/null
fi

if [ -z "${BASE_IMAGE:-}" ]; then
    suite=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-bookworm}")
    BASE_IMAGE=localhost/nvdp-base:${suite:-bookworm}
    step "base $BASE_IMAGE"
    bounded 600 "making the base with mmdebstrap" image/make-base.sh "$BASE_IMAGE"
fi

version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nvidia_device_plugin/__init__.py)
step "building $IMAGE_TAG (version $version) on $BASE_IMAGE"
started=$(date +%s)
export RUNTIME BASE_IMAGE
bounded 600 "buildah bud (image/build-image.sh)" image/build-image.sh "$IMAGE_TAG"
echo "built in $(( $(date +%s) - started )) s, $(podman image inspect --format '{{.Size}}' "$IMAGE_TAG") bytes"

step "running $IMAGE_TAG against the kubelet stand-in"
mkdir -p "$(dirname "$REPORT")"; rm -f "$REPORT"
NVDP_IMAGE_UNDER_TEST=$IMAGE_TAG NVDP_IMAGE_RUNTIME=$RUNTIME NVDP_IMAGE_TEST_REPORT=$REPORT \
    bounded 300 "the image tests (tests/deploy/test_image.py)" \
    "$PYTHON" -m pytest -p no:cacheprovider -o addopts= -q --timeout 120 tests/deploy/test_image.py
step "measured: $(tr -d '\n ' < "$REPORT")"
