"""SHA-1 and SHA-256 digests from CPython's own hash modules, without loading hashlib.

hashlib loads OpenSSL's `_hashlib`, about 0.5 MB of resident memory in every process that touches it, for
what the daemon needs: a few digests for name-based UUIDs (base/uuids.py) and one per config-file event
(the watched file's fingerprint). CPython's `_sha1` and `_sha2` give the same digests; hashlib is the fallback
for an interpreter built without them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol


class Digest(Protocol):
    def digest(self) -> bytes: ...

    def hexdigest(self) -> str: ...


def _builtin(module: str, name: str) -> Callable[[bytes], Any]:
    try:
        return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]
    except (ImportError, AttributeError):  # built without it: OpenSSL's, through hashlib
        import hashlib

        return getattr(hashlib, name)  # type: ignore[no-any-return]


_SHA1 = _builtin("_sha1", "sha1")
_SHA256 = _builtin("_sha2", "sha256")


def sha1(data: bytes) -> Digest:
    """`hashlib.sha1(data)`, digest for digest."""
    result: Digest = _SHA1(data)
    return result


def sha256(data: bytes) -> Digest:
    """`hashlib.sha256(data)`, digest for digest."""
    result: Digest = _SHA256(data)
    return result
