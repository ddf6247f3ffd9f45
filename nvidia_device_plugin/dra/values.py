"""How numbers are written into DRA devices: versions as strict semver, sizes as Kubernetes quantities.

Versions must be strict semver or the API server refuses the slice (and the allocator fails every
selector on it): the driver's "535.104.05" is published as 535.104.5, "12.4" as 12.4.0, as NVIDIA does.
"""

from __future__ import annotations

import re

_NUMERIC = re.compile(r"[0-9]+")


def semver(text: str) -> str | None:
    """`text` as strict semver: "535.104.05" -> "535.104.5", "12.4" -> "12.4.0"; None when not numeric."""
    parts = text.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(_NUMERIC.fullmatch(p) for p in parts):
        return None
    return ".".join(str(int(p)) for p in [*parts, "0", "0"][:3])


def quantity(value: int) -> str:
    """A non-negative integer as a Kubernetes quantity in its canonical binary form: 85899345920 -> 80Gi."""
    for suffix, scale in (
        ("Ei", 1024**6),
        ("Pi", 1024**5),
        ("Ti", 1024**4),
        ("Gi", 1024**3),
        ("Mi", 1024**2),
    ):
        if value >= scale and value % scale == 0:
            return f"{value // scale}{suffix}"
    if value >= 1024 and value % 1024 == 0:
        return f"{value // 1024}Ki"
    return str(value)
