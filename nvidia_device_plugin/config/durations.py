"""Go duration strings ("90s", "1m30s", "300ms"), which NVIDIA's configs and GFD's flags use for intervals."""

from __future__ import annotations

import re

_DURATION_PART = re.compile(
    r"([0-9]*(?:\.[0-9]*)?)(ns|us|µs|μs|ms|s|m|h)"
)  # Go accepts both spellings of micro
_DURATION_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(text: str) -> float | None:
    """Seconds in a Go duration string ("90s", "1m30s", "1.5h", "300ms"); None when `text` is not one."""
    sign = 1.0
    body = text
    if body[:1] in ("+", "-"):
        sign = -1.0 if body[0] == "-" else 1.0
        body = body[1:]
    if body == "0":
        return 0.0
    if not body:
        return None
    total = 0.0
    pos = 0
    while pos < len(body):
        match = _DURATION_PART.match(body, pos)
        if match is None or match.group(1) in ("", "."):
            return None
        total += float(match.group(1)) * _DURATION_UNIT_SECONDS[match.group(2)]
        pos = match.end()
    return sign * total
