"""base/digests.py gives hashlib's digests, byte for byte (config fingerprints and the simulator's UUIDs)."""

from __future__ import annotations

import hashlib

import pytest

from nvidia_device_plugin.base.digests import sha1, sha256


@pytest.mark.parametrize("data", [b"", b"version: v1\n", bytes(range(256)) * 1000])
def test_digests_are_hashlibs(data: bytes) -> None:
    assert sha1(data).digest() == hashlib.sha1(data).digest()
    assert sha1(data).hexdigest() == hashlib.sha1(data).hexdigest()
    assert sha256(data).digest() == hashlib.sha256(data).digest()
    assert sha256(data).hexdigest() == hashlib.sha256(data).hexdigest()
