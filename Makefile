# Every target creates .venv on first use, so a fresh machine needs only `make demo` or `make test`.
# The chart tests render deployments/helm with helm-sdkpy (Helm's Go library), which needs Python >= 3.12, so the
# venv is built with the newest 3.12 that pyenv has, else python3.12 on PATH, else python3 (then the chart tests
# fail, saying so). Override with `make PYTHON=/path/to/python3.12 ...`.
PYTHON ?= $(shell v=$$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.[0-9]+)?$$' | tail -n1); \
	{ [ -n "$$v" ] && PYENV_VERSION=$$v pyenv which python3.12; } 2>/dev/null || \
	{ python3.12 -c '' 2>/dev/null && echo python3.12; } || echo python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The compiled methods of the package's dataclasses, beside its bytecode (base/dataclass_code.py: 50-60 ms of
# each start of the daemon). Made with the venv and again before each bench; a stale one only costs time.
DATACLASS_CACHE := $(BIN)/python -m nvidia_device_plugin.base.dataclass_code

.PHONY: demo test lint typecheck unit proto bench soak manifests image image-multiarch image-test release clean

$(STAMP): pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	$(DATACLASS_CACHE)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/nvidia-device-plugin demo

lint: $(STAMP)
	$(BIN)/ruff check nvidia_device_plugin tests bench image
	$(BIN)/ruff format --check nvidia_device_plugin tests bench image

# image/*.py: the release's scripts (not part of the package, so not in [tool.mypy] files).
typecheck: $(STAMP)
	$(BIN)/mypy
	$(BIN)/mypy image/release.py image/hash_lock.py

# Two pytest workers per core (pytest-xdist): much of the suite waits on the processes and stand-ins it
# starts, so one worker per core left the cores idle a third of the time (2 cores: 154 s with 2 workers, 114 s
# with 4; two `make test` side by side, 4 workers each: 217-224 s, both passed). Its tests make many small
# files and the CDI writer fsyncs its specs, which cost ten times more on an ext4 /tmp than on a tmpfs: where
# /dev/shm is a writable tmpfs with 256 MiB free (a run uses under 10 MiB), temporary files go there. Unix
# sockets stay under /tmp (tests/conftest.py: short paths).
TEST_TMPDIR ?= $(shell d=/dev/shm; [ -d $$d ] && [ -w $$d ] && \
	[ "$$(df -Pk $$d 2>/dev/null | awk 'NR==2 {print $$4}')" -gt 262144 ] 2>/dev/null && echo $$d/nvdp-tests-$$(id -u))
TEST_WORKERS ?= $(shell echo $$(( $$(nproc 2>/dev/null || echo 1) * 2 )))

unit: $(STAMP)
	$(if $(TEST_TMPDIR),mkdir -p $(TEST_TMPDIR) && TMPDIR=$(TEST_TMPDIR)) $(BIN)/pytest -n $(TEST_WORKERS)

test: lint typecheck unit

# Kubelet's protos are all named api.proto: each is compiled under its own path prefix, so the generated
# modules (and the descriptor pool's file names) do not collide.
PROTOS := nvidia_device_plugin/api/v1beta1/api.proto \
	nvidia_device_plugin/api/podresources/v1/api.proto \
	nvidia_device_plugin/api/dra/v1/api.proto \
	nvidia_device_plugin/api/dra/v1beta1/api.proto \
	nvidia_device_plugin/api/pluginregistration/v1/api.proto \
	nvidia_device_plugin/api/dra_health/v1alpha1/api.proto \
	nvidia_device_plugin/api/dra_health/v1beta1/api.proto \
	nvidia_device_plugin/api/dra_health/v1/api.proto

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

bench: $(STAMP)
	$(DATACLASS_CACHE)
	$(BIN)/python -m bench

soak: $(STAMP)
	NVDP_SOAK=1 $(BIN)/pytest -m soak -p no:cacheprovider --timeout 3600 tests

# manifests/ from the Helm chart: each preset in deployments/helm/presets rendered by the real Helm engine.
# `make test` fails while the committed files and the chart disagree (tests/deploy/test_chart.py).
manifests: $(STAMP)
	PYTHONPATH=tests $(BIN)/python tests/deploy/render_manifests.py

# Image builds. IMAGE: the repository to tag (and, for image-multiarch, push to), the chart's image.repository
# default; BASE_IMAGE: another base than the Dockerfile's digest-pinned default (pin it by digest too, and pass
# that digest as BASE_DIGEST, recorded in the org.opencontainers.image.base.digest label); PIP_INDEX,
# PIP_EXTRA_INDEX: package indexes; PIP_CA_FILE: a PEM file of CAs pip must trust (a TLS-intercepting proxy, a
# private index). All optional.
IMAGE ?= registry.example.com/gpu/nvidia-device-plugin-py
PLATFORMS ?= linux/amd64,linux/arm64
BASE_IMAGE ?=
BASE_DIGEST ?=
PIP_INDEX ?=
PIP_EXTRA_INDEX ?=
PIP_CA_FILE ?=
VERSION = $$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nvidia_device_plugin/__init__.py)
REVISION = $$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE = $$(git remote get-url origin 2>/dev/null || echo "")
IMAGE_ARGS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) --build-arg SOURCE=$(SOURCE) \
	$(if $(BASE_IMAGE),--build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg BASE_DIGEST=$(BASE_DIGEST)) \
	$(if $(PIP_INDEX),--build-arg PIP_INDEX=$(PIP_INDEX)) \
	$(if $(PIP_EXTRA_INDEX),--build-arg PIP_EXTRA_INDEX=$(PIP_EXTRA_INDEX)) \
	$(if $(PIP_CA_FILE),--build-arg PIP_CA_BUNDLE="$$(cat $(PIP_CA_FILE))")

# One image for this machine's architecture, into the local Docker engine (classic builder or BuildKit).
image:
	docker build $(IMAGE_ARGS) -t $(IMAGE):$(VERSION) .

# amd64 and arm64 (GH200/GB200 nodes) in one manifest list, pushed to $(IMAGE): a multi-platform image cannot
# be loaded into a local engine. Needs `docker buildx` and, for the other architecture, QEMU binfmt handlers.
image-multiarch:
	docker buildx build --platform $(PLATFORMS) $(IMAGE_ARGS) -t $(IMAGE):$(VERSION) --push .

# Build the image with Debian's buildah on a base made locally (mmdebstrap; no registry needed) and run it under
# the DaemonSet's security context against the kubelet stand-in (image/image-test.sh; installs the tools with
# apt-get if missing). Prints the image size and start-to-registered time (also in build/image-test.json).
image-test: $(STAMP)
	PYTHON=$(BIN)/python BASE_IMAGE=$(BASE_IMAGE) PIP_INDEX=$(PIP_INDEX) PIP_EXTRA_INDEX=$(PIP_EXTRA_INDEX) \
		PIP_CA_FILE=$(PIP_CA_FILE) image/image-test.sh

# The release, in dist/: the packaged chart (nvidia-device-plugin-$(VERSION).tgz), the image as OCI archives for
# linux/amd64 and linux/arm64 (nvidia-device-plugin-py-$(VERSION)-linux-<arch>.oci.tar; arm64 needs QEMU binfmt
# on an amd64 host, else it is skipped, saying so), a CycloneDX SBOM of each image's Python environment
# (.cdx.json) and SHA256SUMS; image/release.sh. REUSE_IMAGE: an image `make image-test` built from this commit,
# reused for this machine's architecture (.ci/run passes it). docs/operations.md, "Releasing and mirroring".
REUSE_IMAGE ?=
release: $(STAMP)
	PYTHON=$(BIN)/python IMAGE=$(IMAGE) DIST=dist BASE_IMAGE=$(BASE_IMAGE) REUSE_IMAGE=$(REUSE_IMAGE) \
		PIP_INDEX=$(PIP_INDEX) PIP_EXTRA_INDEX=$(PIP_EXTRA_INDEX) PIP_CA_FILE=$(PIP_CA_FILE) image/release.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
