"""The host's NVIDIA device nodes: which ones a container of a GPU or MIG device needs, and which exist.

Paths here are the ones a container sees ("/dev/nvidia3"); `under(root, path)` puts one under a host root
(`nvidiaDevRoot` for a host path, the probe root where this process looks). Allocate (serving/) and the
CDI specs (cdi/) both read these facts, so a device spec and a CDI device name the same nodes:

* the control nodes /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools and /dev/nvidia-modeset, each
  given only where it exists (not every node has nvidia-modeset);
* /dev/nvidia<minor> of each GPU; on a WSL2 node (one with /dev/dxg, the DirectX kernel interface through
  which WSL2 reaches the Windows host's GPUs, and no /dev/nvidia* nodes) /dev/dxg instead, the one node of
  every GPU, as NVIDIA's plugin gives it (internal/rm wslDevice.GetPaths);
* for a MIG device, the capability nodes /dev/nvidia-caps/nvidia-cap<N> of its GPU instance and compute
  instance. N comes from discovery (`MigDevice.caps_minors`, read from nvidia-caps/mig-minors) or else
  from the `DeviceFileMinor:` line of <procRoot>/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]
  /access;
* the IMEX channels /dev/nvidia-caps-imex-channels/channel<id> that the config names and the node has;
* with nvidia-drm loaded, a GPU's DRM nodes /dev/dri/card<N> and /dev/dri/renderD<M>: the entries named
  card* and renderD* under its PCI device in sysfs (bus/pci/devices/<bus id>/drm/), as NVIDIA's toolkit
  finds them, each given only where it exists; and udev's /dev/dri/by-path/pci-<bus id>-card / -render
  links to them, which a CDI spec recreates in the container.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence
from pathlib import Path

from nvidia_device_plugin.base.boundedio import SMALL_FILE_BYTES, read_text
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.devices import MigDevice

CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MIG_CAPS_DEVICE_DIR = "/dev/nvidia-caps"
IMEX_CHANNEL_DEVICE_DIR = "/dev/nvidia-caps-imex-channels"
_MIG_CAPABILITIES_DIR = "driver/nvidia/capabilities"  # under the proc root
DRM_DEVICE_DIR = "/dev/dri"
_DRM_NODE_PREFIXES = ("card", "renderD")  # in this order, as NVIDIA lists them


def under(root: str, path: str) -> str:
    """`path` (absolute) inside `root`, as Go's filepath.Join(root, path) puts it."""
    return posixpath.normpath(posixpath.join(root, path.lstrip("/")))


def exists(probe_root: str, path: str) -> bool:
    """Whether the node `path` exists where this process sees the host's / (`probe_root`)."""
    return Path(under(probe_root, path)).exists()


def present_control_nodes(probe_root: str) -> tuple[str, ...]:
    """The control nodes that exist on this node, in CONTROL_DEVICE_NODES order."""
    return tuple(node for node in CONTROL_DEVICE_NODES if exists(probe_root, node))


def gpu_device_node(minor: int) -> str:
    return f"/dev/nvidia{minor}"


WSL_DEVICE_NODE = "/dev/dxg"


def is_wsl(probe_root: str) -> bool:
    """Whether this is a WSL2 node: /dev/dxg exists (NVIDIA asks for libdxcore.so, there beside it)."""
    return exists(probe_root, WSL_DEVICE_NODE)


def gpu_device_nodes(minor: int, probe_root: str) -> tuple[str, ...]:
    """The node(s) of the GPU with `minor` a container needs: /dev/nvidia<minor>, or /dev/dxg on WSL2."""
    return (WSL_DEVICE_NODE,) if is_wsl(probe_root) else (gpu_device_node(minor),)


def mig_capability_nodes(mig: MigDevice, gpu_minor: int, proc_root: str) -> tuple[str, str]:
    """The capability nodes of `mig`'s GPU instance and compute instance (its GPU has `gpu_minor`).

    Raises AllocationError naming the proc file when the minors were not discovered and cannot be read.
    """
    if mig.caps_minors is not None:  # resolved at discovery from nvidia-caps/mig-minors
        gi_minor, ci_minor = mig.caps_minors
        return _capability_node(gi_minor), _capability_node(ci_minor)
    gi = posixpath.join(
        proc_root, _MIG_CAPABILITIES_DIR, f"gpu{gpu_minor}", "mig", f"gi{mig.gpu_instance_id}"
    )
    return (
        mig_capability_device_node(posixpath.join(gi, "access")),
        mig_capability_device_node(posixpath.join(gi, f"ci{mig.compute_instance_id}", "access")),
    )


def mig_capability_device_node(access_file: str) -> str:
    """The /dev/nvidia-caps node that grants the capability whose proc `access` file is given."""
    try:
        text = read_text(access_file, SMALL_FILE_BYTES, errors="replace")
    except OSError as exc:
        raise AllocationError(
            f"cannot read MIG capability file {access_file}: {exc.strerror or exc}; "
            "is MIG configured and /proc/driver/nvidia visible to the plugin?"
        ) from exc
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            try:
                return _capability_node(int(value.strip()))
            except ValueError:
                break
    raise AllocationError(f"MIG capability file {access_file} has no valid 'DeviceFileMinor: <N>' line")


def _capability_node(minor: int) -> str:
    return f"{MIG_CAPS_DEVICE_DIR}/nvidia-cap{minor}"


def imex_channel_path(channel_id: int) -> str:
    return f"{IMEX_CHANNEL_DEVICE_DIR}/channel{channel_id}"


def present_imex_channels(channel_ids: Sequence[int], probe_root: str) -> list[str]:
    """The IMEX channel nodes of `channel_ids` that exist on this node, in that order."""
    return [path for path in map(imex_channel_path, channel_ids) if exists(probe_root, path)]


def sysfs_pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's "00000000:07:00.0" as sysfs names the device: "0000:07:00.0" (4-digit domain, lower case)."""
    domain, _, rest = nvml_bus_id.lower().partition(":")
    return f"{domain[-4:]}:{rest}"


def drm_device_nodes(nvml_bus_id: str, sysfs_root: str, probe_root: str) -> tuple[str, ...]:
    """The DRM nodes of the GPU at `nvml_bus_id` that exist: its card* nodes, then its renderD* nodes.

    None without nvidia-drm (no drm/ directory under the PCI device): an empty tuple, not an error.
    """
    drm = Path(sysfs_root) / "bus/pci/devices" / sysfs_pci_bus_id(nvml_bus_id) / "drm"
    try:
        names = os.listdir(drm)
    except OSError:
        return ()
    nodes = [
        posixpath.join(DRM_DEVICE_DIR, name)
        for prefix in _DRM_NODE_PREFIXES
        for name in sorted(n for n in names if n.startswith(prefix))
    ]
    return tuple(node for node in nodes if exists(probe_root, node))


def drm_by_path_links(nvml_bus_id: str, nodes: Sequence[str], probe_root: str) -> tuple[tuple[str, str], ...]:
    """udev's by-path links of the GPU at `nvml_bus_id` that point at one of `nodes`: (target, link) pairs.

    The target is the link's own text ("../card1"), as the container gets the same relative link.
    """
    links = []
    for kind in ("card", "render"):
        link = f"{DRM_DEVICE_DIR}/by-path/pci-{sysfs_pci_bus_id(nvml_bus_id)}-{kind}"
        try:
            target = os.readlink(under(probe_root, link))
        except OSError:
            continue
        if posixpath.normpath(posixpath.join(posixpath.dirname(link), target)) in nodes:
            links.append((target, link))
    return tuple(links)
