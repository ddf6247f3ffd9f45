"""Reading a labels file as NFD reads it (features.d format), for tests of the daemon's and GFD's output."""

from __future__ import annotations

from pathlib import Path

from nvidia_device_plugin.labels.nfd import parse_features


def read_labels(path: Path) -> dict[str, str]:
    """The labels in the file at `path`; {} while it does not exist (not written yet, or removed)."""
    try:
        return parse_features(path.read_text())
    except FileNotFoundError:
        return {}
