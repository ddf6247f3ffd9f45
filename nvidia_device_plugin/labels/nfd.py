"""Node Feature Discovery's local source: a features.d file of `key=value` lines, written atomically.

NFD's worker reads every file in `/etc/kubernetes/node-feature-discovery/features.d/` on each pass and
keeps a file's labels on the node for as long as the file exists; hidden files (a leading `.`) are
skipped, which is where the half-written temp file lives until it is renamed over the real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.base.boundedio import SMALL_FILE_BYTES, read_text
from nvidia_device_plugin.base.errors import DevicePluginError

DEFAULT_MACHINE_TYPE_FILE = "/sys/class/dmi/id/product_name"
DEFAULT_OUTPUT_FILE = "/etc/kubernetes/node-feature-discovery/features.d/gfd"


class LabelsFileError(DevicePluginError):
    """The labels file could not be written."""


def render_features(labels: Mapping[str, str]) -> str:
    """NFD's features.d format: one `key=value` line per label, sorted."""
    return "".join(f"{key}={labels[key]}\n" for key in sorted(labels))


def parse_features(text: str) -> dict[str, str]:
    """The labels of a features.d file (the inverse of render_features; used by `labels` and tests)."""
    labels: dict[str, str] = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            labels[key.strip()] = value.strip()
    return labels


def write_features(path: Path, labels: Mapping[str, str]) -> None:
    """Replace `path` with `labels` atomically (temp file in the same directory, fsync, rename)."""
    try:
        replace_file(path, render_features(labels))
    except OSError as exc:
        raise LabelsFileError(f"cannot write the labels file {path}: {exc.strerror or exc}") from exc


def read_machine_type(path: str) -> str:
    """The machine type as GFD reads it: the file's text, stripped; "unknown" when unset or unreadable."""
    if not path:
        return "unknown"
    try:
        return read_text(path, SMALL_FILE_BYTES, errors="replace").strip() or "unknown"
    except OSError:
        return "unknown"
