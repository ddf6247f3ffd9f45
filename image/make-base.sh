#!/usr/bin/env bash
# Make the image's base locally, with no container registry: a minimal Debian root filesystem with python3,
# its venv module, `python` and kmod (so the Dockerfile need not apt-get it), made by mmdebstrap from
# Debian's archive and imported into podman.
#   image/make-base.sh [NAME]      (default localhost/nvdp-base:<suite>; SUITE defaults to this host's)
# Reused while an image of that name exists (delete it with `podman rmi NAME` to make it anew).
set -euo pipefail
suite=${SUITE:-$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")}
suite=${suite:-bookworm}
name=${1:-localhost/nvdp-base:$suite}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}

if podman image exists "$name"; then
    echo "base $name exists"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "making base $name: Debian $suite with python3, python3-venv, python-is-python3, kmod"
mmdebstrap --quiet --variant=minbase --format=tar \
    --include=python3,python3-venv,python-is-python3,ca-certificates,kmod \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$work/rootfs.tar" \
    "deb $mirror $suite main" "deb $mirror $suite-updates main" "deb $security $suite-security main"
podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' \
    "$work/rootfs.tar" "$name" > /dev/null
echo "base $name made ($(podman image inspect --format '{{.Size}}' "$name") bytes)"
