"""What the node has that a CDI spec refers to: the driver's files and the device nodes.

Paths are returned as the container sees them ("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"), that is
relative to the driver root (or the /dev root) with a leading "/"; spec generation adds the host roots.
What NVIDIA's toolkit (nvcdi) finds, this finds:

* every library named `*.so.<driver version>` in the driver's library directories and their vdpau/
  subdirectory (CUDA, NVML, GLX, EGL, GLES, VDPAU, NVENC, OptiX...), and the legacy libnvidia-nvvm70;
* their SONAME and `.so` links, as the host has them (links.py), and the graphics files (graphics.py);
* the driver's binaries and its GSP firmware;
* the control nodes, each GPU's /dev/nvidia<minor> and (with nvidia-drm) its DRM nodes and by-path links,
  a MIG device's capability nodes, the IMEX channels configured, and each extra mode's nodes.

Every problem that leaves the spec unusable is a CdiError naming the file or directory that is missing or
unreadable. An extra mode without its kernel nodes is not a problem: its spec is left out (spec.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nvidia_device_plugin import devnodes
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.cdi.graphics import GraphicsFiles, scan_graphics
from nvidia_device_plugin.cdi.links import driver_library_links
from nvidia_device_plugin.cdi.model import CdiError, extra_mode
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.plans.resources import AdvertisedDevice

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
LIBRARY_SUBDIRS = ("", "vdpau")  # NVIDIA's driver library locator also looks in vdpau/
BINARY_DIRS = ("usr/bin", "usr/sbin", "bin", "sbin")
BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-imex",
    "nvidia-imex-ctl",
)
# Without these two no CUDA or NVML program runs in the container: a driver root lacking them is refused.
REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
_LEGACY_NVVM = re.compile(r"^libnvidia-nvvm70\.so\..+$")
FIRMWARE_DIRS = ("lib/firmware/updates", "lib/firmware")
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
    links: tuple[str, ...] = ()  # the driver create-symlinks hook's "<target>::<link>" (links.py)
    graphics: GraphicsFiles = field(default_factory=GraphicsFiles)


@dataclass(frozen=True)
class NodeScan:
    """Everything spec generation reads from the node."""

    driver: DriverFiles
    control_nodes: tuple[str, ...]  # of /dev/nvidiactl, nvidia-uvm, nvidia-uvm-tools, nvidia-modeset
    # Physical UUID (GPU or MIG) -> its device nodes: /dev/nvidiaN and its DRM nodes, or a MIG device's
    # /dev/nvidiaN and capability nodes.
    device_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Physical UUID -> its /dev/dri/by-path links, "<target>::<link>".
    device_links: dict[str, tuple[str, ...]] = field(default_factory=dict)
    extra_mode_nodes: dict[str, tuple[str, ...]] = field(default_factory=dict)  # () when absent
    extra_mode_mounts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    imex_channels: dict[int, str] = field(default_factory=dict)  # channel ID -> its node, when present


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
    libraries, found = _libraries(root, version)
    for required in REQUIRED_LIBRARIES:
        if f"{required}.{version}" not in found:
            raise CdiError(
                f"{required}.{version} (driver {version}) was not found under the driver root {root} "
                f"(searched {', '.join(LIBRARY_DIRS)}); is containerDriverRoot the driver root, and is "
                "the driver installed there?"
            )
    library_dirs = tuple(dict.fromkeys(os.path.dirname(lib) for lib in libraries))
    binaries = [
        next(f"/{d}/{name}" for d in BINARY_DIRS if (root / d / name).is_file())
        for name in BINARIES
        if any((root / d / name).is_file() for d in BINARY_DIRS)
    ]
    socket = root / PERSISTENCED_SOCKET
    return DriverFiles(
        root=str(root),
        version=version,
        libraries=libraries,
        library_dirs=library_dirs,
        binaries=tuple(binaries),
        firmware=_firmware(root, version),
        persistenced_socket="/" + PERSISTENCED_SOCKET if socket.exists() else None,
        links=driver_library_links(root, libraries, version),
        graphics=scan_graphics(
            root, [d for d in library_dirs if not d.endswith("/vdpau")], libraries, version
        ),
    )


def _libraries(root: Path, version: str) -> tuple[tuple[str, ...], set[str]]:
    """The driver's libraries (container paths, by directory in search order) and their file names."""
    suffix = f".so.{version}"
    libraries: list[str] = []
    seen: set[str] = set()
    for rel_dir in LIBRARY_DIRS:
        base = root / rel_dir
        if base.is_symlink() or not base.is_dir():
            continue  # lib64 -> usr/lib64 and the like: the target is scanned under its own name
        for sub in LIBRARY_SUBDIRS:
            directory = base / sub if sub else base
            if sub and (directory.is_symlink() or not directory.is_dir()):
                continue
            names = [
                n
                for n in _list_dir(directory)
                if (n.endswith(suffix) or _LEGACY_NVVM.match(n)) and n not in seen
            ]
            names = sorted(n for n in names if (directory / n).is_file())
            seen.update(names)
            prefix = "/" + "/".join(p for p in (rel_dir, sub) if p)
            libraries += (f"{prefix}/{name}" for name in names)
    return tuple(libraries), seen


def _firmware(root: Path, version: str) -> tuple[str, ...]:
    for base in FIRMWARE_DIRS:
        directory = root / base / "nvidia" / version
        if directory.is_dir():
            names = sorted(n for n in _list_dir(directory) if n.startswith("gsp") and n.endswith(".bin"))
            return tuple(f"/{base}/nvidia/{version}/{n}" for n in names if (directory / n).is_file())
    return ()


def scan_node(
    inventory: Inventory,
    devices: Iterable[AdvertisedDevice],
    driver_root: Path,
    host: HostPaths,
    extra_modes: Sequence[str] = (),
    imex_channel_ids: Sequence[int] = (),
) -> NodeScan:
    """Scan the driver root and the device nodes of `devices` (the physical devices behind them)."""
    driver = scan_driver_root(driver_root, inventory.driver_version)
    dev_root = str(host.dev_root)
    control = devnodes.present_control_nodes(dev_root)
    if "/dev/nvidiactl" not in control:
        raise CdiError(
            f"/dev/nvidiactl does not exist under {dev_root}: the NVIDIA kernel driver is not loaded, or "
            "the host's /dev is not visible to the plugin"
        )
    scan = NodeScan(driver=driver, control_nodes=control)
    for dev in devices:
        if dev.physical_uuid not in scan.device_nodes:
            _scan_device(scan, inventory, dev, host)
    for mode in extra_modes:
        scan.extra_mode_nodes[mode] = _extra_mode_nodes(mode, host.dev_root)
        mounts = extra_mode(mode).mounts if scan.extra_mode_nodes[mode] else ()
        scan.extra_mode_mounts[mode] = tuple(m for m in mounts if (driver_root / m.lstrip("/")).exists())
    for channel, path in zip(
        imex_channel_ids, map(devnodes.imex_channel_path, imex_channel_ids), strict=True
    ):
        if devnodes.exists(dev_root, path):
            scan.imex_channels[channel] = path
    return scan


def _scan_device(scan: NodeScan, inventory: Inventory, dev: AdvertisedDevice, host: HostPaths) -> None:
    gpu = inventory.gpu(dev.gpu_uuid)
    if gpu is None:
        raise CdiError(f"GPU {dev.gpu_uuid} of advertised device {dev.id} is not in the inventory")
    dev_root = str(host.dev_root)
    gpu_node = devnodes.gpu_device_node(gpu.minor)
    if not devnodes.exists(dev_root, gpu_node):
        raise CdiError(f"{gpu_node} of {gpu.label} does not exist under {dev_root}")
    if dev.kind != "mig":
        drm = devnodes.drm_device_nodes(gpu.pci_bus_id, str(host.sysfs_root), dev_root)
        links = devnodes.drm_by_path_links(gpu.pci_bus_id, drm, dev_root)
        scan.device_nodes[dev.physical_uuid] = (gpu_node, *drm)
        scan.device_links[dev.physical_uuid] = tuple(f"{target}::{link}" for target, link in links)
        return
    mig = inventory.mig_device(dev.physical_uuid)
    if mig is None:
        raise CdiError(f"{dev.label} is not in the inventory")
    try:
        caps = devnodes.mig_capability_nodes(mig, gpu.minor, str(host.proc_root))
    except AllocationError as exc:
        raise CdiError(str(exc)) from exc
    for cap in caps:
        if not devnodes.exists(dev_root, cap):
            raise CdiError(f"{cap} of {mig.label} does not exist under {dev_root}")
    scan.device_nodes[dev.physical_uuid] = (gpu_node, *caps)
    scan.device_links[dev.physical_uuid] = ()


def _extra_mode_nodes(mode: str, dev_root: Path) -> tuple[str, ...]:
    found: list[str] = []
    for pattern in extra_mode(mode).device_node_globs:
        found += sorted("/" + str(p.relative_to(dev_root)) for p in (dev_root / "dev").glob(pattern))
    return tuple(found)


def _list_dir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError as exc:
        raise CdiError(f"cannot read {directory}: {exc.strerror or exc}") from exc
