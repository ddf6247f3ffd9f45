#!/usr/bin/env bash
# Build the image with Debian's buildah, for one architecture: `make image-test` and `make release` both use it,
# so the image they test and the one they ship are built the same way.
#   image/build-image.sh TAG [ARCH]        (ARCH: amd64 or arm64; default this machine's)
# Environment: BASE_IMAGE (required: buildah here builds on a base made locally, image/make-base.sh),
# BASE_DIGEST (default: the local base's own digest), PIP_INDEX / PIP_EXTRA_INDEX / PIP_CA_FILE (passed to the
# build; PIP_CA_FILE defaults to this host's extra CAs in /usr/local/share/ca-certificates, which a
# TLS-intercepting proxy needs), RUNTIME (default runc: crun refuses this kind of hybrid-cgroup host).
# --no-cache: buildah 1.28 reuses cached layers across changed build-args.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:?usage: image/build-image.sh TAG [ARCH]}
arch=${2:-}
: "${BASE_IMAGE:?BASE_IMAGE names the base to build on}"
RUNTIME=${RUNTIME:-runc}
base_digest=${BASE_DIGEST:-$(podman image inspect --format '{{.Digest}}' "$BASE_IMAGE" 2> /dev/null || true)}

ca_file=${PIP_CA_FILE:-}
cleanup=""
if [ -z "$ca_file" ] && compgen -G '/usr/local/share/ca-certificates/*.crt' > /dev/null; then
    ca_file=$(mktemp); cleanup=$ca_file; cat /usr/local/share/ca-certificates/*.crt > "$ca_file"
fi
trap '[ -z "$cleanup" ] || rm -f "$cleanup"' EXIT
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nvidia_device_plugin/__init__.py)
buildah bud --quiet --no-cache --layers=false --runtime "$RUNTIME" --network host \
    ${arch:+--arch "$arch"} \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg BASE_DIGEST="$base_digest" \
    --build-arg VERSION="$version" \
    --build-arg REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
    --build-arg SOURCE="$(git remote get-url origin 2>/dev/null || echo "")" \
    ${PIP_INDEX:+--build-arg PIP_INDEX="$PIP_INDEX"} \
    ${PIP_EXTRA_INDEX:+--build-arg PIP_EXTRA_INDEX="$PIP_EXTRA_INDEX"} \
    ${ca_file:+--build-arg PIP_CA_BUNDLE="$(cat "$ca_file")"} \
    --tag "$tag" . > /dev/null
