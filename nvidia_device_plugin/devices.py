"""The discovered inventory: plain frozen values, produced by nvml.discovery and read by everything else."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum


class PcieLevel(IntEnum):
    """How two GPUs reach each other over PCIe, nearest first (NVML's nvmlGpuTopologyLevel_t)."""

    INTERNAL = 0  # same board (multi-GPU card)
    SINGLE = 10  # one PCIe switch
    MULTIPLE = 20  # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # same host bridge
    NODE = 40  # same NUMA node, across host bridges
    SYSTEM = 50  # across NUMA nodes (SMP interconnect)


@dataclass(frozen=True)
class MigDevice:
    """A MIG device (GPU instance + compute instance) carved out of a physical GPU."""

    uuid: str
    index: int  # position among the parent's MIG devices, as nvmlDeviceGetMigDeviceHandleByIndex counts
    parent_uuid: str
    parent_index: int
    profile: str  # e.g. "1g.10gb", derived from the device attributes as NVIDIA's tooling names it
    memory_bytes: int
    gpu_instance_id: int
    compute_instance_id: int
    # The GPU-instance profile ID (nvmlGpuInstanceProfile); None where NVML would not say.
    profile_id: int | None = None
    # /dev/nvidia-caps/nvidia-cap<N> minors of its GPU instance and compute instance, resolved at
    # discovery (from <proc>/driver/nvidia-caps/mig-minors); None where the host does not list them.
    caps_minors: tuple[int, int] | None = None
    # nvmlDeviceGetAttributes of the MIG device (what GFD's per-profile labels publish); None where
    # NVML would not say.
    attributes: MigAttributes | None = None
    # nvmlGpuInstanceGetInfo of its GPU instance: NVML's ID of the instance's profile (its `profileId`,
    # unlike `profile_id` above) and its placement (first memory slice, slices); DRA names a MIG device by
    # these (dra/names.py). None where NVML would not say.
    gi_profile_info_id: int | None = None
    placement: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        """How messages name this MIG device: "MIG device 3:1 (MIG-...)" (parent index : MIG index)."""
        return f"MIG device {self.parent_index}:{self.index} ({self.uuid})"


@dataclass(frozen=True)
class MigAttributes:
    """A MIG device's slices, SMs and shared engines, as nvmlDeviceGetAttributes reports them."""

    memory_mb: int
    multiprocessors: int
    gpu_instance_slices: int
    compute_instance_slices: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_decoders: int
    ofa_engines: int


@dataclass(frozen=True)
class MigPlacementOption:
    """One place where a GPU instance of one profile can be made on a GPU in MIG mode, as NVML lists it
    (nvmlDeviceGetGpuInstancePossiblePlacements_v2 for the profile nvmlDeviceGetGpuInstanceProfileInfo
    names): what dynamic MIG publishes as a partition (dra/kinds) and what it creates at Prepare."""

    profile: str  # e.g. "1g.10gb", named as MigDevice.profile is
    gi_profile_id: int  # the profile info's `id` (19 for 1g.10gb on A100)
    start: int  # first memory slice of the placement
    size: int  # memory slices it covers
    memory_bytes: int
    multiprocessors: int
    # The profile's engines and compute slices, as nvmlDeviceGetGpuInstanceProfileInfo says (what a MIG device
    # of this placement would report in MigAttributes).
    attributes: MigAttributes | None = None


@dataclass(frozen=True)
class GpuFabric:
    """Where a GPU sits on a multi-node NVLink fabric (GB200/GB300 NVL, fabric-attached H100/H200).

    Only GPUs that nvmlDeviceGetGpuFabricInfo reports as attached (fabric registration completed, with
    success, under a cluster UUID that is not all zero) have one; GPUs with the same cluster UUID and clique
    ID reach each other over NVLink across nodes.
    """

    cluster_uuid: str  # the fabric's cluster UUID, "8-4-4-4-12" lowercase hex
    clique_id: int


@dataclass(frozen=True)
class VgpuInfo:
    """A vGPU: a GPU the hypervisor's vGPU manager shares, as its PCI config space says (GFD's vgpu.*)."""

    host_driver_version: str  # the vGPU manager's driver on the host, e.g. "550.54.16"
    host_driver_branch: str  # e.g. "r550_40"


@dataclass(frozen=True)
class Gpu:
    """A physical GPU."""

    index: int
    uuid: str
    name: str  # product name, e.g. "NVIDIA A100-SXM4-80GB"
    memory_bytes: int
    pci_bus_id: str  # NVML's form, e.g. "00000000:07:00.0"
    minor: int  # N in /dev/nvidiaN
    numa_node: int | None
    mig_enabled: bool
    mig_devices: tuple[MigDevice, ...] = ()
    lost: bool = False  # GPU_IS_LOST during discovery: advertised, and marked unhealthy by the daemon
    # Read for node labels; None where NVML or sysfs would not say (the label is then left out).
    compute_capability: tuple[int, int] | None = None  # CUDA compute capability (major, minor)
    pci_class: str | None = None  # sysfs PCI class, "0x030200" (3D controller) or "0x030000" (VGA)
    mig_capable: bool = False  # nvmlDeviceGetMigMode answered (MIG can be enabled on it)
    nvswitch_links: int = 0  # NVLinks from this GPU to NVSwitches
    fabric: GpuFabric | None = None  # None: not attached to an NVLink fabric, or NVML would not say
    vgpu: VgpuInfo | None = None  # None: not a vGPU, or its PCI config space could not be read whole
    vgpu_checked: bool = False  # its PCI config space was read whole, so `vgpu` is known
    pcie_root: str | None = None  # its PCIe root complex, "pci0000:00", from sysfs (DRA's pcieRoot)
    brand: str | None = None  # NVML's brand, as go-nvlib spells it ("Nvidia", "Tesla"), for DRA
    architecture: str | None = None  # NVML's architecture ("Ampere", "Ada Lovelace"), for DRA
    # In MIG mode: every possible GPU-instance placement of every profile the GPU supports, and the number of
    # memory slices they are counted in (8 on A100/H100/H200/B200); () and 0 where not read or not in MIG.
    mig_placements: tuple[MigPlacementOption, ...] = ()
    mig_memory_slices: int = 0

    @property
    def label(self) -> str:
        """How messages name this GPU: "GPU 3 (GPU-...)"."""
        return f"GPU {self.index} ({self.uuid})"


@dataclass(frozen=True)
class DiscoveryProblem:
    """Something discovery could not read on one GPU (or the node), and what it did instead."""

    gpu_index: int | None  # None: not tied to one GPU
    call: str  # the pynvml function, e.g. "nvmlDeviceGetMemoryInfo"
    code: int  # NVML's return code
    message: str  # operator-readable: what failed and what the plugin does about it

    @property
    def kind(self) -> str:
        """A short stable label for metrics and log deduplication."""
        return f"{self.call}:{self.code}"


@dataclass(frozen=True)
class GpuLink:
    """How one pair of GPUs (a < b by index) is connected."""

    a: int
    b: int
    nvlinks: int  # NVLink lanes between them, directly or through NVSwitch; 0 when none
    pcie: PcieLevel


@dataclass(frozen=True)
class Inventory:
    """Everything discovery found on the node at one moment."""

    gpus: tuple[Gpu, ...]
    links: tuple[GpuLink, ...] = ()
    driver_version: str = ""
    cuda_driver_version: int = 0
    problems: tuple[DiscoveryProblem, ...] = field(default=(), compare=False)
    # Lookup tables derived from the fields above, so each lookup is O(1) on hot paths. Not init fields:
    # dataclasses.replace() builds fresh ones for the new value instead of sharing (and filling) these.
    _by_uuid: dict[str, Gpu] = field(default_factory=dict, init=False, compare=False, repr=False)
    _migs: dict[str, MigDevice] = field(default_factory=dict, init=False, compare=False, repr=False)
    _links: dict[tuple[int, int], GpuLink] = field(
        default_factory=dict, init=False, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        self._by_uuid.update({g.uuid: g for g in self.gpus})
        self._migs.update({m.uuid: m for g in self.gpus for m in g.mig_devices})
        self._links.update({(link.a, link.b): link for link in self.links})

    def gpu(self, uuid: str) -> Gpu | None:
        return self._by_uuid.get(uuid)

    def link(self, a: int, b: int) -> GpuLink | None:
        return self._links.get((min(a, b), max(a, b)))

    def mig_device(self, uuid: str) -> MigDevice | None:
        return self._migs.get(uuid)

    def gpu_of(self, uuid: str) -> Gpu | None:
        """The GPU `uuid` is, or the GPU the MIG device `uuid` is carved from; None when unknown."""
        gpu = self._by_uuid.get(uuid)
        if gpu is None and (mig := self._migs.get(uuid)) is not None:
            gpu = self._by_uuid.get(mig.parent_uuid)
        return gpu

    @property
    def cuda_version(self) -> tuple[int, int] | None:
        """The CUDA version the driver supports, (12, 4), from NVML's encoding (12040); None when unknown."""
        if self.cuda_driver_version <= 0:
            return None
        return self.cuda_driver_version // 1000, self.cuda_driver_version % 1000 // 10


def describe(inventory: Inventory, uuid: str) -> str:
    """How log lines name a physical device: "GPU 3 (GPU-...)", "MIG device 0:1 (MIG-...)"."""
    known: Gpu | MigDevice | None = inventory.gpu(uuid) or inventory.mig_device(uuid)
    return known.label if known is not None else f"device {uuid}"


def link_groups(inventory: Inventory, joined: Callable[[GpuLink], bool]) -> dict[int, int]:
    """GPU index -> the lowest minor in its group: GPUs joined, transitively, by the links `joined` accepts.

    The one union-find over the links: DRA's nvlinkDomain/pcieSwitch attributes and our NVLink domain-size
    label both group GPUs through it, so they agree on which GPUs share a domain. A GPU no accepted link
    reaches is a group of its own.
    """
    parent = {gpu.index: gpu.index for gpu in inventory.gpus}

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for link in inventory.links:
        if link.a in parent and link.b in parent and joined(link):
            a, b = root(link.a), root(link.b)
            parent[max(a, b)] = min(a, b)
    minors: dict[int, int] = {}
    for gpu in inventory.gpus:
        group = root(gpu.index)
        minors[group] = min(minors.get(group, gpu.minor), gpu.minor)
    return {gpu.index: minors[root(gpu.index)] for gpu in inventory.gpus}
