"""The simulator's name-based UUIDs: `uuid.uuid5`, byte for byte, without loading hashlib.

`uuid.uuid5` imports hashlib, which loads OpenSSL's `_hashlib` (about 0.5 MB of RSS) into every simulated
`run` for a handful of SHA-1 digests; base/digests.py gives the same digest from CPython's own SHA-1.
"""

from __future__ import annotations

import uuid

from nvidia_device_plugin.base.digests import sha1


def name_uuid(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """What `uuid.uuid5(namespace, name)` returns (RFC 4122 version 5: SHA-1 of namespace and name)."""
    return uuid.UUID(bytes=sha1(namespace.bytes + name.encode("utf-8")).digest()[:16], version=5)
