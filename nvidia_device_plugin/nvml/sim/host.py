"""The host tree of a simulated node: sysfs, procfs and /dev as the NVIDIA driver lays them out.

Discovery reads NUMA nodes from sysfs, and Allocate (passDeviceSpecs) looks for the control nodes under
/dev and reads MIG capability minors from procfs. A simulated node writes those files into a throwaway
directory, so the same readers run unchanged. Device nodes are plain files: nothing opens them.

The tree also holds a fake driver root (`driver_root`, see driver_root.py) for the CDI spec scan, and
the nodes nvidia-drm makes, as on a node with the module loaded (a WSL2 node, `wsl: true`, has /dev/dxg and
none of these nodes): each GPU's DRM card and render node
(/dev/dri/card<minor + 1>, /dev/dri/renderD<128 + minor>; card0 is the board's own VGA, not an NVIDIA
device), listed under its PCI device in sysfs (bus/pci/devices/<bus id>/drm/) as the kernel lists them,
and udev's /dev/dri/by-path/pci-<bus id>-card and -render links to them.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.nvml.sim.driver_root import write_driver_root
from nvidia_device_plugin.nvml.sim.node import GpuSpec, MigSpec, NodeSpec
from nvidia_device_plugin.nvml.sim.pci_config import pci_config

CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")  # no nvidia-modeset: it is optional
# The driver's nvidia-caps minor numbering (driver/nvidia-caps/mig-minors): 1 and 2 are the config and
# monitor capabilities, then per GPU 15 GPU instances, each with its own minor and 8 compute instances.
_GPU_INSTANCES = 15
_COMPUTE_INSTANCES = 8
_PER_GI = 1 + _COMPUTE_INSTANCES
_PER_GPU = _GPU_INSTANCES * _PER_GI
_FIRST_GPU_MINOR = 3


def gpu_minor(gpu: GpuSpec) -> int:
    """N of /dev/nvidiaN: the node file's `minor` (default: the index; real drivers may differ)."""
    return gpu.minor if gpu.minor >= 0 else gpu.index


def mig_instance_ids(gpu: GpuSpec, mig: MigSpec) -> tuple[int, int]:
    """(GPU instance ID, compute instance ID) of a simulated MIG device.

    The driver's IDs are opaque; position-based GPU instance IDs with one compute instance each keep them
    unique and inside the driver's range; an instance made at run time keeps the ID it was made with.
    """
    return (mig.slot + 1 if mig.gi_id is None else mig.gi_id), 0


def gi_cap_minor(minor: int, gi: int) -> int:
    return _FIRST_GPU_MINOR + minor * _PER_GPU + gi * _PER_GI


def ci_cap_minor(minor: int, gi: int, ci: int) -> int:
    return gi_cap_minor(minor, gi) + 1 + ci


def materialize_host(node: NodeSpec, root: Path) -> HostPaths:
    """Write `node`'s sysfs, procfs and /dev files under `root` (an empty directory)."""
    host = HostPaths(
        sysfs_root=root / "sys",
        proc_root=root / "proc",
        dev_root=root / "root",
        driver_root=root / "driver-root",
        spec_root=root / "root",
    )
    write_driver_root(root / "driver-root", node.driver_version, wsl=node.wsl)
    dev = host.dev_root / "dev"
    (dev / "nvidia-caps").mkdir(parents=True)
    for name in CONTROL_NODES:
        (dev / name).touch()
    (dev / "dri/by-path").mkdir(parents=True)
    (dev / "dri/card0").touch()  # the board's VGA (BMC): no NVIDIA GPU's
    minors = ["config 1", "monitor 2"]
    for gpu in node.gpus:
        pci = _pci_device_dir(host.sysfs_root, gpu.pci_bus_id)
        (pci / "numa_node").write_text(f"{gpu.numa_node}\n")
        (pci / "class").write_text(f"{gpu.pci_class}\n")  # GFD's gpu.mode label reads it
        (pci / "config").write_bytes(pci_config(gpu, node.unprivileged_container))  # and vgpu.* this
        minor = gpu_minor(gpu)
        (dev / f"nvidia{minor}").touch()
        _drm_nodes(pci, dev, pci.name, minor)
        for gi in range(_GPU_INSTANCES):
            minors.append(f"gpu{minor}/gi{gi}/access {gi_cap_minor(minor, gi)}")
            minors += [
                f"gpu{minor}/gi{gi}/ci{ci}/access {ci_cap_minor(minor, gi, ci)}"
                for ci in range(_COMPUTE_INSTANCES)
            ]
        if gpu.mig_enabled:
            for mig in gpu.mig:
                gi, ci = mig_instance_ids(gpu, mig)
                gi_dir = host.proc_root / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
                _capability(gi_dir / "access", gi_cap_minor(minor, gi), dev)
                _capability(gi_dir / f"ci{ci}" / "access", ci_cap_minor(minor, gi, ci), dev)
    caps = host.proc_root / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    (caps / "mig-minors").write_text("".join(f"{line}\n" for line in minors))
    if node.wsl:
        _as_wsl(dev)
    return host


def _as_wsl(dev: Path) -> None:
    """A WSL2 guest's /dev: /dev/dxg, and none of the nodes the Linux driver and nvidia-drm make."""
    shutil.rmtree(dev)
    dev.mkdir()
    (dev / "dxg").touch()


def _pci_device_dir(sysfs_root: Path, pci_bus_id: str) -> Path:
    """A GPU's sysfs directory, under its root complex as the kernel lays it out, with the
    bus/pci/devices link to it. The simulated root complex is the bus rounded down to 0x20 (several
    root complexes per socket, as on EPYC and Xeon servers), so GPUs on one PCIe switch share one."""
    domain, rest = pci_bus_id.lower().split(":", 1)
    name = f"{domain[-4:]}:{rest}"
    root = f"pci{domain[-4:]}:{int(rest.split(':')[0], 16) & 0xE0:02x}"
    device = sysfs_root / "devices" / root / name
    device.mkdir(parents=True)
    link = sysfs_root / "bus" / "pci" / "devices" / name
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(device)
    return device


def add_mig_capabilities(host: HostPaths, minor: int, gi: int, ci: int) -> None:
    """The capability files of a MIG device made at run time, as the driver makes its /proc ones and
    nvidia-modprobe (or nvidia-ctk) its /dev/nvidia-caps nodes."""
    gi_dir = host.proc_root / "driver/nvidia/capabilities" / f"gpu{minor}" / "mig" / f"gi{gi}"
    dev = host.dev_root / "dev"
    _capability(gi_dir / "access", gi_cap_minor(minor, gi), dev)
    _capability(gi_dir / f"ci{ci}" / "access", ci_cap_minor(minor, gi, ci), dev)


def _capability(access: Path, cap_minor: int, dev: Path) -> None:
    access.parent.mkdir(parents=True, exist_ok=True)
    # The driver's format; DeviceFileMode 292 is 0444.
    access.write_text(f"DeviceFileMinor: {cap_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
    (dev / "nvidia-caps" / f"nvidia-cap{cap_minor}").touch()


def drm_node_names(minor: int) -> tuple[str, str]:
    """The DRM card and render node names of the GPU with `minor` on a simulated node."""
    return f"card{minor + 1}", f"renderD{128 + minor}"


def _drm_nodes(pci: Path, dev: Path, bus_id: str, minor: int) -> None:
    card, render = drm_node_names(minor)
    for name, kind in ((card, "card"), (render, "render")):
        (pci / "drm" / name).mkdir(parents=True)
        (dev / "dri" / name).touch()
        (dev / "dri/by-path" / f"pci-{bus_id}-{kind}").symlink_to(f"../{name}")
