"""What the node has that a CDI spec refers to: the driver's files and the device nodes.

Paths are returned as the container sees them ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"), that is
relative to the driver root (or the /dev root) with a leading "/"; spec generation adds the host roots.
Every problem is a CdiError naming the file or directory that is missing or unreadable.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_device_plugin import devnodes
from nvidia_device_plugin.cdi.model import CdiError, extra_mode
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.errors import AllocationError
from nvidia_device_plugin.resources import AdvertisedDevice

# Where distributions and the driver installer put the driver's user-space libraries, in search order.
LIBRARY_DIRS = (
    "usr/lib64",
    "usr/lib/x86_64-linux-gnu",
    "usr/lib/aarch64-linux-gnu",
    "lib64",
    "lib/x86_64-linux-gnu",
    "lib/aarch64-linux-gnu",
    "usr/lib",
)
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
# Without these two no CUDA or NVML program runs in the container: a driver root lacking them is refused.
REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
# The driver's own libraries carry its exact version as their suffix: libnvidia-ml.so.550.54.15.
_LIBRARY_STEMS = r"(?:libcuda|libcudadebugger|libnvcuvid|libnvoptix|libnvidia-[A-Za-z0-9_.+-]+?)"
FIRMWARE_DIR = "lib/firmware/nvidia"
PERSISTENCED_SOCKET = "run/nvidia-persistenced/socket"


@dataclass(frozen=True)
class DriverFiles:
    """The driver's files found under the driver root (container paths, sorted)."""

    root: str  # the directory scanned, as this process sees it
    version: str
    libraries: tuple[str, ...]
    library_dirs: tuple[str, ...]  # the directories holding them, for ldcache
    binaries: tuple[str, ...]
    firmware: tuple[str, ...]
    persistenced_socket: str | None = None


@dataclass(frozen=True)
class NodeScan:
    """Everything spec generation reads from the node."""

    driver: DriverFiles
    control_nodes: tuple[str, ...]  # of /dev/nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset
    # Physical UUID (GPU or MIG) -> its device nodes: /dev/nvidiaN, and a MIG device's capability nodes.
    device_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    extra_mode_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)


def scan_driver_root(root: Path, version: str) -> DriverFiles:
    """The driver's libraries, binaries and firmware under `root`; CdiError when the root is unusable."""
    if not version:
        raise CdiError(
            "the driver version is unknown (NVML did not report it), so its libraries cannot be found"
        )
    if not root.is_dir():
        raise CdiError(
            f"the driver root {root} does not exist or is not a directory; mount the host's driver root "
            "there (containerDriverRoot / --container-driver-root) so the CDI spec can name its libraries"
        )
    pattern = re.compile(rf"^{_LIBRARY_STEMS}\.so\.{re.escape(version)}$")
    libraries: list[str] = []
    library_dirs: list[str] = []
    seen: set[str] = set()
    for rel_dir in LIBRARY_DIRS:
        directory = root / rel_dir
        if directory.is_symlink() or not directory.is_dir():
            continue  # lib64 -> usr/lib64 and the like: the target is scanned under its own name
        found = [name for name in _list_dir(directory) if pattern.match(name) and name not in seen]
        found = [name for name in found if (directory / name).is_file()]
        if found:
            seen.update(found)
            library_dirs.append("/" + rel_dir)
            libraries += (f"/{rel_dir}/{name}" for name in sorted(found))
    for required in REQUIRED_LIBRARIES:
        if f"{required}.{version}" not in seen:
            raise CdiError(
                f"{required}.{version} (driver {version}) was not found under the driver root {root} "
                f"(searched {', '.join(LIBRARY_DIRS)}); is containerDriverRoot the driver root, and is "
                "the driver installed there?"
            )
    binaries = [
        next(f"/{d}/{name}" for d in BINARY_DIRS if (root / d / name).is_file())
        for name in BINARIES
        if any((root / d / name).is_file() for d in BINARY_DIRS)
    ]
    firmware_dir = root / FIRMWARE_DIR / version
    firmware = (
        [
            f"/{FIRMWARE_DIR}/{version}/{n}"
            for n in sorted(_list_dir(firmware_dir))
            if (firmware_dir / n).is_file()
        ]
        if firmware_dir.is_dir()
        else []
    )
    socket = root / PERSISTENCED_SOCKET
    return DriverFiles(
        root=str(root),
        version=version,
        libraries=tuple(libraries),
        library_dirs=tuple(library_dirs),
        binaries=tuple(binaries),
        firmware=tuple(firmware),
        persistenced_socket="/" + PERSISTENCED_SOCKET if socket.exists() else None,
    )


def scan_node(
    inventory: Inventory,
    devices: Iterable[AdvertisedDevice],
    driver_root: Path,
    dev_root: Path,
    proc_root: Path,
    extra_modes: Sequence[str] = (),
) -> NodeScan:
    """Scan the driver root and the device nodes of `devices` (the physical devices behind them)."""
    driver = scan_driver_root(driver_root, inventory.driver_version)
    control = devnodes.present_control_nodes(str(dev_root))
    if "/dev/nvidiactl" not in control:
        raise CdiError(
            f"/dev/nvidiactl does not exist under {dev_root}: the NVIDIA kernel driver is not loaded, or "
            "the host's /dev is not visible to the plugin"
        )
    nodes: dict[str, tuple[str, ...]] = {}
    for dev in devices:
        if dev.physical_uuid not in nodes:
            nodes[dev.physical_uuid] = _device_nodes(inventory, dev, dev_root, proc_root)
    extra = {mode: _extra_mode_nodes(mode, dev_root) for mode in extra_modes}
    return NodeScan(driver=driver, control_nodes=control, device_nodes=nodes, extra_mode_nodes=extra)


def _device_nodes(
    inventory: Inventory, dev: AdvertisedDevice, dev_root: Path, proc_root: Path
) -> tuple[str, ...]:
    gpu = inventory.gpu(dev.gpu_uuid)
    if gpu is None:
        raise CdiError(f"GPU {dev.gpu_uuid} of advertised device {dev.id} is not in the inventory")
    gpu_node = devnodes.gpu_device_node(gpu.minor)
    if not devnodes.exists(str(dev_root), gpu_node):
        raise CdiError(f"{gpu_node} of {gpu.label} does not exist under {dev_root}")
    if dev.kind != "mig":
        return (gpu_node,)
    mig = inventory.mig_device(dev.physical_uuid)
    if mig is None:
        raise CdiError(f"{dev.label} is not in the inventory")
    try:
        caps = devnodes.mig_capability_nodes(mig, gpu.minor, str(proc_root))
    except AllocationError as exc:
        raise CdiError(str(exc)) from exc
    for cap in caps:
        if not devnodes.exists(str(dev_root), cap):
            raise CdiError(f"{cap} of {mig.label} does not exist under {dev_root}")
    return (gpu_node, *caps)


def _extra_mode_nodes(mode: str, dev_root: Path) -> tuple[str, ...]:
    globs = extra_mode(mode).device_node_globs
    found: list[str] = []
    for pattern in globs:
        found += sorted("/" + str(p.relative_to(dev_root)) for p in (dev_root / "dev").glob(pattern))
    if not found:
        wanted = ", ".join(f"/dev/{p}" for p in globs)
        raise CdiError(
            f"{mode}Enabled is true but no {wanted} exists under {dev_root}: load the {mode} kernel module "
            f"or set {mode}Enabled to false (Allocate would name {mode}=all, which no spec could define)"
        )
    return tuple(found)


def _list_dir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError as exc:
        raise CdiError(f"cannot read {directory}: {exc.strerror or exc}") from exc
