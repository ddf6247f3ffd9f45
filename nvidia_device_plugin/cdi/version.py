"""The lowest `cdiVersion` a spec document can declare, from the features it uses.

A runtime refuses (or, podman 4.3, silently drops) a spec whose version is newer than it knows, and the
CDI library refuses one whose version is older than its fields need. So each spec declares the lowest
version that has every feature it uses, as the CDI library's MinimumRequiredVersion computes it:

* 0.3.0: the earliest version the CDI library still loads;
* 0.4.0: a mount with a `type`;
* 0.5.0: a device name that does not start with a letter ("0", "3:1"), a device node with a `hostPath`;
* 0.6.0: `annotations` on the spec or a device, a "." in the class of `kind`;
* 0.7.0: `intelRdt` or `additionalGids` in any edits;
* 0.8.0 and 1.0.0 added no spec fields; 1.1.0: `netDevices`, or intelRdt's `schemata`/`enableMonitoring`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

EARLIEST = "0.3.0"


def minimum_version(document: dict[str, Any]) -> str:
    """The lowest CDI version whose fields cover `document` (a spec as JSON)."""
    devices: list[dict[str, Any]] = document.get("devices", [])
    edits = list(_all_edits(document))
    _, _, cdi_class = str(document.get("kind", "")).partition("/")
    checks = (
        ("1.1.0", any(e.get("netDevices") or _rdt_v110(e.get("intelRdt")) for e in edits)),
        ("0.7.0", any("intelRdt" in e or e.get("additionalGids") for e in edits)),
        (
            "0.6.0",
            bool(document.get("annotations"))
            or any(d.get("annotations") for d in devices)
            or "." in cdi_class,
        ),
        (
            "0.5.0",
            any(not _starts_with_letter(str(d.get("name", "a"))) for d in devices)
            or any(n.get("hostPath") for e in edits for n in e.get("deviceNodes", [])),
        ),
        ("0.4.0", any(m.get("type") for e in edits for m in e.get("mounts", []))),
    )
    return next((version for version, needed in checks if needed), EARLIEST)


def _all_edits(document: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield document.get("containerEdits", {})
    for device in document.get("devices", []):
        yield device.get("containerEdits", {})


def _starts_with_letter(name: str) -> bool:
    return not name or (name[0].isascii() and name[0].isalpha())


def _rdt_v110(rdt: object) -> bool:
    return isinstance(rdt, dict) and ("schemata" in rdt or bool(rdt.get("enableMonitoring")))
