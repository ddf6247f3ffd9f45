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

from pathlib import Path

from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.nvml.sim.driver_root import write_driver_root
from nvidia_device_plugin.nvml.sim.node import GpuSpec, MigSpec, NodeSpec
from nvidia_device_plugin.nvml.sim.pci_config import pci_config
from nvidia_device_plugin.nvml.sim.tree import FileTree

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
    tree = FileTree(root)
    write_driver_root(tree.subtree("driver-root"), node.driver_version, wsl=node.wsl)
    proc, sysfs = tree.subtree("proc"), tree.subtree("sys")
    dev: FileTree | None = None
    if node.wsl:  # /dev/dxg, and none of the nodes the Linux driver and nvidia-drm make
        tree.file("root/dev/dxg")
    else:
        dev = _dev_nodes(tree.subtree("root/dev"), node)
    minors = ["config 1", "monitor 2"]
    for gpu in node.gpus:
        pci = _pci_device_dir(sysfs, gpu.pci_bus_id)
        sysfs.file(f"{pci}/numa_node", f"{gpu.numa_node}\n")
        sysfs.file(f"{pci}/class", f"{gpu.pci_class}\n")  # GFD's gpu.mode label reads it
        sysfs.file(f"{pci}/config", pci_config(gpu, node.unprivileged_container))  # and vgpu.* this
        minor = gpu_minor(gpu)
        for name in drm_node_names(minor):  # the GPU's DRM nodes, as the kernel lists them under it
            sysfs.directory(f"{pci}/drm/{name}")
        for gi in range(_GPU_INSTANCES):
            minors.append(f"gpu{minor}/gi{gi}/access {gi_cap_minor(minor, gi)}")
            minors += [
                f"gpu{minor}/gi{gi}/ci{ci}/access {ci_cap_minor(minor, gi, ci)}"
                for ci in range(_COMPUTE_INSTANCES)
            ]
        if gpu.mig_enabled:
            for mig in gpu.mig:
                _capabilities(proc, dev, minor, *mig_instance_ids(gpu, mig))
    proc.file("driver/nvidia-caps/mig-minors", "".join(f"{line}\n" for line in minors))
    return host


def _dev_nodes(dev: FileTree, node: NodeSpec) -> FileTree:
    """/dev of a Linux node: the control nodes, a node per GPU, the DRM nodes and udev's by-path links."""
    dev.directory("nvidia-caps")
    for name in CONTROL_NODES:
        dev.file(name)
    dev.file("dri/card0")  # the board's VGA (BMC): no NVIDIA GPU's
    dev.directory("dri/by-path")
    for gpu in node.gpus:
        minor = gpu_minor(gpu)
        dev.file(f"nvidia{minor}")
        for name, kind in zip(drm_node_names(minor), ("card", "render"), strict=True):
            dev.file(f"dri/{name}")
            dev.link(f"dri/by-path/pci-{_sysfs_name(gpu.pci_bus_id)}-{kind}", f"../{name}")
    return dev


def _sysfs_name(pci_bus_id: str) -> str:
    """A bus ID as sysfs names the device: a 4-digit domain (`00000000:07:00.0` -> `0000:07:00.0`)."""
    domain, rest = pci_bus_id.lower().split(":", 1)
    return f"{domain[-4:]}:{rest}"


def _pci_device_dir(sysfs: FileTree, pci_bus_id: str) -> str:
    """A GPU's sysfs directory (relative to sysfs), under its root complex as the kernel lays it out,
    with the bus/pci/devices link to it. The simulated root complex is the bus rounded down to 0x20
    (several root complexes per socket, as on EPYC and Xeon servers), so GPUs on one PCIe switch share
    one."""
    name = _sysfs_name(pci_bus_id)
    domain, bus = name.split(":")[:2]
    device = f"devices/pci{domain}:{int(bus, 16) & 0xE0:02x}/{name}"
    sysfs.link(f"bus/pci/devices/{name}", sysfs.directory(device))
    return device


def add_mig_capabilities(host: HostPaths, minor: int, gi: int, ci: int) -> None:
    """The capability files of a MIG device made at run time, as the driver makes its /proc ones and
    nvidia-modprobe (or nvidia-ctk) its /dev/nvidia-caps nodes."""
    _capabilities(FileTree(host.proc_root), FileTree(host.dev_root / "dev"), minor, gi, ci)


def _capabilities(proc: FileTree, dev: FileTree | None, minor: int, gi: int, ci: int) -> None:
    """A MIG device's capability files in procfs, and their /dev/nvidia-caps nodes (none on WSL2)."""
    gi_dir = f"driver/nvidia/capabilities/gpu{minor}/mig/gi{gi}"
    for access, cap_minor in (
        (f"{gi_dir}/access", gi_cap_minor(minor, gi)),
        (f"{gi_dir}/ci{ci}/access", ci_cap_minor(minor, gi, ci)),
    ):
        # The driver's format; DeviceFileMode 292 is 0444.
        proc.file(access, f"DeviceFileMinor: {cap_minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n")
        if dev is not None:
            dev.file(f"nvidia-caps/nvidia-cap{cap_minor}")


def drm_node_names(minor: int) -> tuple[str, str]:
    """The DRM card and render node names of the GPU with `minor` on a simulated node."""
    return f"card{minor + 1}", f"renderD{128 + minor}"
