# Every target creates .venv on first use, so a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit proto bench soak image image-multiarch clean

$(STAMP): pyproject.toml setup.cfg
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/nvidia-device-plugin demo

lint: $(STAMP)
	$(BIN)/ruff check nvidia_device_plugin tests bench
	$(BIN)/ruff format --check nvidia_device_plugin tests bench

typecheck: $(STAMP)
	$(BIN)/mypy

unit: $(STAMP)
	$(BIN)/pytest

test: lint typecheck unit

# Kubelet's protos are all named api.proto: each is compiled under its own path prefix, so the generated
# modules (and the descriptor pool's file names) do not collide.
PROTOS := nvidia_device_plugin/api/v1beta1/api.proto \
	nvidia_device_plugin/api/dra/v1/api.proto \
	nvidia_device_plugin/api/dra/v1beta1/api.proto \
	nvidia_device_plugin/api/pluginregistration/v1/api.proto

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

bench: $(STAMP)
	$(BIN)/python -m bench

soak: $(STAMP)
	NVDP_SOAK=1 $(BIN)/pytest -m soak -p no:cacheprovider --timeout 3600 tests

# Image builds. IMAGE: the repository to tag (and, for image-multiarch, push to); BASE_DIGEST: the digest the
# Dockerfile's base is pinned to, recorded in the org.opencontainers.image.base.digest label.
IMAGE ?= nvidia-device-plugin-py
PLATFORMS ?= linux/amd64,linux/arm64
BASE_DIGEST ?=
VERSION = $$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nvidia_device_plugin/__init__.py)
REVISION = $$(git rev-parse HEAD 2>/dev/null || echo unknown)
SOURCE = $$(git remote get-url origin 2>/dev/null || echo "")
IMAGE_ARGS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) --build-arg SOURCE=$(SOURCE) \
	--build-arg BASE_DIGEST=$(BASE_DIGEST)

# One image for this machine's architecture, into the local Docker engine (classic builder or BuildKit).
image:
	docker build $(IMAGE_ARGS) -t $(IMAGE):$(VERSION) .

# amd64 and arm64 (GH200/GB200 nodes) in one manifest list, pushed to $(IMAGE): a multi-platform image cannot
# be loaded into a local engine. Needs `docker buildx` and, for the other architecture, QEMU binfmt handlers.
image-multiarch:
	docker buildx build --platform $(PLATFORMS) $(IMAGE_ARGS) -t $(IMAGE):$(VERSION) --push .

clean:
	rm -rf $(VENV) build dist *.egg-info
