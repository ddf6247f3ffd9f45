#!/usr/bin/env bash
# `make release`: everything a team needs to mirror this version, in dist/ (DIST):
#   nvidia-device-plugin-<version>.tgz                   the Helm chart, packaged by Helm (version = appVersion)
#   nvidia-device-plugin-py-<version>-linux-<arch>.oci.tar   the image, an OCI archive per architecture
#   nvidia-device-plugin-py-<version>-linux-<arch>.cdx.json  CycloneDX SBOM of that image's Python environment
#   SHA256SUMS                                           over all of the above (`sha256sum -c SHA256SUMS`)
# amd64 and arm64 are built with buildah --arch (image/build-image.sh, as `make image-test` builds); the
# architecture that is not this machine's runs its build steps under QEMU user emulation, so it is built only
# where the kernel has the binfmt handler (/proc/sys/fs/binfmt_misc/qemu-<cpu>, from Debian's
# qemu-user-binfmt); otherwise this says so and skips it, and still exits 0.
# Environment: PYTHON (the venv's python, with helm-sdkpy and cyclonedx-bom), DIST, IMAGE (the name the archives
# carry, the chart's image.repository), BASE_IMAGE (default: made locally as `make image-test` makes it),
# REUSE_IMAGE (an image of this machine's architecture already built from this same clean commit, for example
# `make image-test`'s: used instead of building it again), PIP_INDEX / PIP_EXTRA_INDEX / PIP_CA_FILE.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-.venv/bin/python}
DIST=${DIST:-dist}
IMAGE=${IMAGE:-registry.example.com/gpu/nvidia-device-plugin-py}
NAME=nvidia-device-plugin-py
REUSE_IMAGE=${REUSE_IMAGE:-}

step() { echo "== release: $*"; }
fail() { echo "release FAILED at: $*" >&2; exit 1; }
bounded() { local seconds=$1 what=$2; shift 2; timeout --kill-after=10 "$seconds" "$@" || fail "$what (exit $?, limit ${seconds}s)"; }

for tool in buildah podman; do
    command -v "$tool" > /dev/null || fail "$tool is missing (\`make image-test\` installs it from Debian)"
done
version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nvidia_device_plugin/__init__.py)
revision=$(git rev-parse HEAD 2> /dev/null || echo unknown)
started=$(date +%s)
rm -rf "$DIST"; mkdir -p "$DIST"

step "chart"
bounded 120 "helm package" "$PYTHON" image/release.py chart deployments/helm/nvidia-device-plugin "$DIST"

if [ -z "${BASE_IMAGE:-}" ]; then
    suite=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-bookworm}")
    export BASE_IMAGE=localhost/nvdp-base:${suite:-bookworm}
    bounded 600 "making the base with mmdebstrap" image/make-base.sh "$BASE_IMAGE"
fi
export BASE_IMAGE

host_arch=$(podman info --format '{{.Host.Arch}}')
built=()
for arch in amd64 arm64; do
    cpu=$([ "$arch" = amd64 ] && echo x86_64 || echo aarch64)
    if [ "$arch" != "$host_arch" ] && ! grep -qs '^enabled' "/proc/sys/fs/binfmt_misc/qemu-$cpu"; then
        step "SKIPPED linux/$arch: this $host_arch host has no QEMU binfmt handler for $cpu" \
            "(/proc/sys/fs/binfmt_misc/qemu-$cpu; Debian: apt-get install qemu-user-binfmt); the release has no $arch image"
        continue
    fi
    tag=localhost/$NAME:$version-$arch
    if [ "$arch" = "$host_arch" ] && [ -n "$REUSE_IMAGE" ] && [ -z "$(git status --porcelain 2> /dev/null)" ] &&
        [ "$(podman image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$REUSE_IMAGE" 2> /dev/null)" = "$revision" ]; then
        step "linux/$arch: reusing $REUSE_IMAGE (built from $revision)"
        tag=$REUSE_IMAGE
    else
        step "building linux/$arch on $BASE_IMAGE"
        bounded 1800 "buildah bud --arch $arch" image/build-image.sh "$tag" "$arch"
    fi
    archive=$DIST/$NAME-$version-linux-$arch.oci.tar
    bounded 300 "buildah push $archive" buildah push --quiet "$tag" "oci-archive:$archive:$IMAGE:$version"
    container=$(buildah from --pull-never "$tag")
    rootfs=$(buildah mount "$container")
    "$PYTHON" image/release.py sbom "$rootfs" "$DIST/$NAME-$version-linux-$arch.cdx.json" ||
        { buildah rm "$container" > /dev/null; fail "the SBOM of linux/$arch"; }
    buildah rm "$container" > /dev/null
    built+=("linux/$arch")
done
[ ${#built[@]} -gt 0 ] || fail "no image built"

step "checksums"
"$PYTHON" image/release.py sums "$DIST" > /dev/null || fail "SHA256SUMS"
step "done in $(( $(date +%s) - started )) s: ${built[*]}"
ls -l "$DIST"
