"""UUIDs' text, as the uuid module writes it, without loading uuid or hashlib.

`uuid` imports `platform` (0.2 MB, 2 ms at every start) and `uuid.uuid5` imports hashlib, which loads
OpenSSL's `_hashlib` (about 0.5 MB of RSS), for what the package needs: the text of a 16-byte UUID (a GPU's
NVLink cluster) and a handful of name-based (version 5) UUIDs (CDI annotation keys, the simulator's GPUs
and MIG devices). base/digests.py gives the same SHA-1 from CPython's own module; the version and variant
bits and the 8-4-4-4-12 text are RFC 4122's. tests/test_uuids.py checks both against the uuid module.
"""

from __future__ import annotations

from nvidia_device_plugin.base.digests import sha1

_BYTES = 16


def uuid_text(raw: bytes) -> str:
    """What `str(uuid.UUID(bytes=raw))` returns; ValueError unless `raw` is 16 bytes, as there."""
    if len(raw) != _BYTES:
        raise ValueError(f"a UUID is {_BYTES} bytes, not {len(raw)}")
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def name_uuid(namespace: str, name: str) -> str:
    """What `str(uuid.uuid5(uuid.UUID(namespace), name))` returns (RFC 4122 version 5: SHA-1 of the
    namespace's 16 bytes and the name); `namespace` is a UUID's usual text."""
    digest = bytearray(
        sha1(bytes.fromhex(namespace.replace("-", "")) + name.encode("utf-8")).digest()[:_BYTES]
    )
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    return uuid_text(bytes(digest))
