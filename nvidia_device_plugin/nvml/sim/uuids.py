"""The simulator's name-based UUIDs: `uuid.uuid5`, byte for byte, without loading hashlib.

`uuid.uuid5` imports hashlib, which loads OpenSSL's `_hashlib` (about 0.5 MB of RSS) into every simulated
`run` for a handful of SHA-1 digests. CPython's own SHA-1 (`_sha1`, built unless the interpreter was
configured without it) gives the same digest; hashlib is the fallback where it is missing.
"""

from __future__ import annotations

import importlib
import uuid
from collections.abc import Callable
from typing import Any


def _sha1_function() -> Callable[[bytes], Any]:
    try:
        return importlib.import_module("_sha1").sha1  # type: ignore[no-any-return]
    except ImportError:  # an interpreter built without its own SHA-1: OpenSSL's, through hashlib
        import hashlib

        return hashlib.sha1


_sha1 = _sha1_function()


def name_uuid(namespace: uuid.UUID, name: str) -> uuid.UUID:
    """What `uuid.uuid5(namespace, name)` returns (RFC 4122 version 5: SHA-1 of namespace and name)."""
    digest: bytes = _sha1(namespace.bytes + name.encode("utf-8")).digest()
    return uuid.UUID(bytes=digest[:16], version=5)
