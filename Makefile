# Every target creates .venv on first use, so a fresh machine needs only `make demo` or `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit proto bench soak image clean

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

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
		nvidia_device_plugin/api/v1beta1/api.proto

bench: $(STAMP)
	$(BIN)/python -m bench

soak: $(STAMP)
	NVDP_SOAK=1 $(BIN)/pytest -m soak -p no:cacheprovider --timeout 3600 tests

image:
	V=$$(sed -n 's/^__version__ = "\(.*\)"/\1/p' nvidia_device_plugin/__init__.py); \
		docker build --build-arg VERSION=$$V -t nvidia-device-plugin-py:$$V .

clean:
	rm -rf $(VENV) build dist *.egg-info
