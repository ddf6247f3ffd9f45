"""Points CONFIG_FILE_DST at the chosen config, atomically, so the plugin never reads a half-made file.

A symlink is created under a temporary name next to the destination and renamed over it: rename(2) within
one directory is atomic, so a reader sees the old target or the new one, never neither. The empty config is
written the same way (a temporary file renamed over the link). Each function returns whether anything
changed, so the caller logs and signals only on a real change.
"""

from __future__ import annotations

import os
from pathlib import Path

from nvidia_device_plugin.base.errors import DevicePluginError


class LinkError(DevicePluginError):
    """CONFIG_FILE_DST cannot be updated (the message names the path and the OS error)."""


def _temporary_name(dst: Path) -> Path:
    return dst.with_name(f".{dst.name}.tmp-{os.getpid()}")


def point_link(dst: Path, target: Path) -> bool:
    """Make `dst` a symlink to `target`; False when it already was."""
    try:
        if dst.is_symlink() and os.readlink(dst) == os.fspath(target):
            return False
        temporary = _temporary_name(dst)
        temporary.unlink(missing_ok=True)
        os.symlink(target, temporary)
        os.replace(temporary, dst)
    except OSError as exc:
        raise LinkError(f"cannot point {dst} at {target}: {exc.strerror or exc}") from exc
    return True


def write_empty_config(dst: Path) -> bool:
    """Make `dst` an empty regular file (the plugin's built-in defaults); False when it already was."""
    try:
        if not dst.is_symlink() and dst.is_file() and dst.stat().st_size == 0:
            return False
        temporary = _temporary_name(dst)
        temporary.unlink(missing_ok=True)
        temporary.write_bytes(b"")
        os.replace(temporary, dst)
    except OSError as exc:
        raise LinkError(f"cannot write the empty config to {dst}: {exc.strerror or exc}") from exc
    return True
