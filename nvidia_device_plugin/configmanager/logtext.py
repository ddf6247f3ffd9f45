"""Text from the API (label values, Status messages) as config-manager quotes it: one line, bounded.

A label value comes from whoever can label the node: a newline in it must not forge a log line, an escape
sequence must not reach a terminal, and a value of any size must not flood the log (a real one is at most 63
characters; the API server refuses longer ones, a fake or broken one may not).
"""

from __future__ import annotations

from nvidia_device_plugin.base.logs import escape_controls

MAX_LOGGED_VALUE_CHARS = 256  # a label value as quoted in a log line
MAX_LOGGED_MESSAGE_CHARS = 2048  # a whole problem line


def shown(text: str, limit: int = MAX_LOGGED_VALUE_CHARS) -> str:
    """`text` with control characters escaped, cut to `limit` characters (saying how long it was)."""
    safe = escape_controls(text)
    if len(safe) <= limit:
        return safe
    return f"{safe[: max(limit - 40, 0)]}... ({len(text)} characters in all)"
