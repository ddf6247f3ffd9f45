"""The `gpu` spec of a WSL2 node (/dev/dxg), with the edits NVIDIA's toolkit makes for one (pure but for the
scan of the driver root).

NVIDIA's toolkit (pkg/nvcdi lib-wsl.go, driver-wsl.go) describes WSL2 so: the device node /dev/dxg, through
which WSL2 reaches every GPU of the Windows host; as mounts, the first of each of its required files found in
the NVIDIA adapter's driver store (/usr/lib/wsl/drivers/<package>/, which it asks dxcore for; here: each
package directory holding libcuda.so.1.1, in name order) and then /usr/lib/wsl/lib; a create-symlinks hook
making /usr/bin/nvidia-smi a link to the mounted nvidia-smi; and update-ldcache over the mounts'
directories. NVIDIA's spec has the one device "all"; this plugin names every device Allocate returns (the
GPU UUIDs, or indices), each with /dev/dxg, so that its CDI names resolve.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nvidia_device_plugin.cdi.edits import (
    CREATE_SYMLINKS,
    UPDATE_LDCACHE,
    VISIBLE_DEVICES_VOID,
    hook,
    node_edit,
)
from nvidia_device_plugin.cdi.model import MOUNT_OPTIONS, CdiError, CdiSettings
from nvidia_device_plugin.devnodes import WSL_DEVICE_NODE, under

WSL_LIBRARY_DIR = "/usr/lib/wsl/lib"
WSL_DRIVER_STORE = "/usr/lib/wsl/drivers"
# NVIDIA's requiredDriverStoreFiles, in its order.
REQUIRED_DRIVER_STORE_FILES = (
    "libcuda.so.1.1",
    "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so",
    "libdxcore.so",
    "libnvdxgdmal.so.1",
    "nvcubins.bin",
    "nvidia-smi",
)
_MAX_DRIVER_PACKAGES = 4096  # entries of /usr/lib/wsl/drivers read (a Windows host has a few hundred)


def wsl_device_edits(settings: CdiSettings) -> dict[str, Any]:
    return {"deviceNodes": [node_edit(WSL_DEVICE_NODE, settings)]}


def wsl_common_edits(driver_root: Path, settings: CdiSettings) -> dict[str, Any]:
    """Mounts and hooks of a WSL2 node's driver files under `driver_root` (as this process sees it).

    Raises CdiError naming the directories searched when libcuda.so.1.1 is in none of them.
    """
    search = [*_driver_stores(driver_root), WSL_LIBRARY_DIR]
    found = [p for name in REQUIRED_DRIVER_STORE_FILES if (p := _first(driver_root, search, name))]
    if not any(posixpath.basename(p) == "libcuda.so.1.1" for p in found):
        raise CdiError(
            f"this WSL2 node (/dev/dxg) has no libcuda.so.1.1 under the driver root {driver_root} "
            f"(searched {', '.join(search)}); is the Windows NVIDIA driver installed, and /usr/lib/wsl "
            "visible under containerDriverRoot?"
        )
    smi = [f"{p}::/usr/bin/nvidia-smi" for p in found if posixpath.basename(p) == "nvidia-smi"]
    folders = dict.fromkeys(posixpath.dirname(p) for p in found)
    hooks = [
        hook(settings, CREATE_SYMLINKS, *(a for link in smi for a in ("--link", link))),
        hook(settings, UPDATE_LDCACHE, *(a for d in folders for a in ("--folder", d))),
    ]
    edits: dict[str, Any] = {
        "env": [VISIBLE_DEVICES_VOID],
        "mounts": [
            {
                "hostPath": under(settings.nvidia_driver_root, p),
                "containerPath": p,
                "options": list(MOUNT_OPTIONS),
            }
            for p in found
        ],
    }
    present = [h for h in hooks if h is not None]
    if present:
        edits["hooks"] = present
    return edits


def _driver_stores(driver_root: Path) -> list[str]:
    """The driver store packages holding libcuda.so.1.1 (the NVIDIA adapter's), in name order."""
    try:
        with os.scandir(driver_root / WSL_DRIVER_STORE.lstrip("/")) as entries:
            names = [e.name for _, e in zip(range(_MAX_DRIVER_PACKAGES), entries, strict=False)]
    except OSError:
        return []
    packages = [posixpath.join(WSL_DRIVER_STORE, name) for name in sorted(names)]
    return [p for p in packages if _is_file(driver_root, posixpath.join(p, "libcuda.so.1.1"))]


def _first(driver_root: Path, directories: Sequence[str], name: str) -> str | None:
    return next((p for d in directories if _is_file(driver_root, p := posixpath.join(d, name))), None)


def _is_file(driver_root: Path, path: str) -> bool:
    try:
        return (driver_root / path.lstrip("/")).is_file()
    except OSError:
        return False
