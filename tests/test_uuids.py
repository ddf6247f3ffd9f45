"""base/uuids.py writes the uuid module's text without loading it: for the simulator's GPUs (presets and
tests name GPUs by them), CDI annotation keys and a GPU's NVLink cluster."""

from __future__ import annotations

import uuid

import pytest

from nvidia_device_plugin.base.uuids import name_uuid, uuid_text

_NAMESPACES = (
    "6b1e0c8a-52c3-4f4e-9d0c-0c2d5b7a9e11",  # the simulator's GPUs
    "3b0c6a52-8f1e-4d59-9a57-6d1f0c2b7e41",  # the simulator's MIG devices made at run time
    "6f1c2f0e-6a43-4f4e-9d0a-3b1f2c9f7d10",  # CDI annotation keys
    str(uuid.UUID(int=0)),
)


@pytest.mark.parametrize("namespace", _NAMESPACES)
@pytest.mark.parametrize("name", ["dgx-a100/0", "GPU-0e9b2c6a/6", "", "é/ü/7", "x" * 10_000])
def test_name_uuid_is_uuid5(namespace: str, name: str) -> None:
    assert name_uuid(namespace, name) == str(uuid.uuid5(uuid.UUID(namespace), name))


_SOME = bytes.fromhex("0e9b2c6a5f3d4e21a7c8b9d0e1f20314")


@pytest.mark.parametrize("raw", [bytes(16), b"\xff" * 16, _SOME, bytes(range(16))])
def test_uuid_text_is_the_uuid_modules(raw: bytes) -> None:
    assert uuid_text(raw) == str(uuid.UUID(bytes=raw))


@pytest.mark.parametrize("raw", [b"", bytes(15), bytes(17)])
def test_uuid_text_refuses_what_is_not_16_bytes(raw: bytes) -> None:
    with pytest.raises(ValueError, match="a UUID is 16 bytes"):
        uuid_text(raw)
