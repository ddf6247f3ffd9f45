"""The simulator's name-based UUIDs: `uuid.uuid5`'s text, character for character, without loading uuid
or hashlib.

`uuid.uuid5` imports hashlib, which loads OpenSSL's `_hashlib` (about 0.5 MB of RSS), and `uuid` itself loads
`platform` (0.2 MB, 2 ms), into every simulated `run` for a handful of digests, where the real path loads
neither (a GPU's UUID is NVML's text). base/digests.py gives the same digest from CPython's own SHA-1; the
version and variant bits and the 8-4-4-4-12 text are RFC 4122's.
"""

from __future__ import annotations

from nvidia_device_plugin.base.digests import sha1


def name_uuid(namespace: str, name: str) -> str:
    """What `str(uuid.uuid5(uuid.UUID(namespace), name))` returns (RFC 4122 version 5: SHA-1 of the
    namespace's 16 bytes and the name); `namespace` is a UUID's usual text."""
    digest = bytearray(sha1(bytes.fromhex(namespace.replace("-", "")) + name.encode("utf-8")).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50  # version 5
    digest[8] = (digest[8] & 0x3F) | 0x80  # the RFC 4122 variant
    text = digest.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
