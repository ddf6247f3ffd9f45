"""What the Kubernetes API answered, in words an operator reads: one wording for every caller of the API.

The `kubernetes` client is not imported here at run time (only for the type), so a command that never talks
to the API does not pay for importing it by importing this module.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kubernetes.client.exceptions import ApiException


def describe_api_error(exc: ApiException) -> str:
    """`HTTP 403 Forbidden: <message>`, the message from the Status object in the body (none, none shown)."""
    try:
        message = json.loads(exc.body or "").get("message", "")
    except (TypeError, ValueError, AttributeError):
        message = ""
    return f"HTTP {exc.status} {exc.reason}" + (f": {message}" if message else "")
