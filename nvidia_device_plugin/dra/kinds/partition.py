"""A dynamic-MIG partition as a DRA device: one possible GPU-instance placement of one MIG profile on a GPU in
MIG mode, published whether or not the instance exists yet (KEP-4815 partitionable devices), as NVIDIA's DRA
driver publishes them under its `DynamicMIG` gate (kubernetes-sigs/dra-driver-nvidia-gpu,
cmd/gpu-kubelet-plugin/partitions.go).

* Named as a static MIG device is (`gpu-<minor>-mig-<profile without dots>-<GI profile ID>-<start>`): a
  placement is the MIG device it would make, so the name does not change when the instance is made.
* type=mig, parentUUID and profile (and uuid once the instance exists); the capacities of the static kind
  (multiprocessors, copyEngines, decoders, encoders, jpegEngines, ofaEngines, memory, memorySlice<N>);
  selected by the `mig.nvidia.com` DeviceClass.
* Each GPU has one counter set, `gpu-<minor>-counter-set`: one `memory-slice-<i>` counter of 1 per memory
  slice and, per capacity dimension, the most any profile of the GPU takes (`multiprocessors`,
  `copy-engines`, `decoders`, `encoders`, `jpeg-engines`, `ofa-engines`, `memory`): the whole GPU. A
  partition consumes its profile's capacities and exactly the memory slices of its placement; a whole GPU,
  where one is published beside them, consumes every counter. The scheduler then never gives two claims
  overlapping placements, nor a whole GPU and a partition of it.
* A MIG device that already exists (made by hand or by nvidia-mig-manager) is published as the placement
  it occupies, with its UUID; placements overlapping it are left out, so its slices are taken and it is
  never replaced. A GPU with a MIG device whose profile ID or placement NVML would not say publishes no
  partitions (`applies` is false): which slices are free is then unknown, so it keeps the static kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from nvidia_device_plugin.devices import Gpu, MigAttributes, MigDevice, MigPlacementOption
from nvidia_device_plugin.dra.kinds import DraDevice, Json
from nvidia_device_plugin.dra.kinds.mig import MIG_CLASS, mig_device_name
from nvidia_device_plugin.dra.values import quantity
from nvidia_device_plugin.plans.resources import AdvertisedDevice, mig_device

# Capacity name -> counter name, as NVIDIA derives one from the other (camelCase to a DNS label).
_ENGINES = (
    ("multiprocessors", "multiprocessors"),
    ("copyEngines", "copy-engines"),
    ("decoders", "decoders"),
    ("encoders", "encoders"),
    ("jpegEngines", "jpeg-engines"),
    ("ofaEngines", "ofa-engines"),
)


def counter_set_name(gpu: Gpu) -> str:
    return f"gpu-{gpu.minor}-counter-set"


def memory_slice_counter(index: int) -> str:
    return f"memory-slice-{index}"


def _engines(attributes: MigAttributes) -> tuple[int, ...]:
    return (
        attributes.multiprocessors,
        attributes.copy_engines,
        attributes.decoders,
        attributes.encoders,
        attributes.jpeg_decoders,
        attributes.ofa_engines,
    )


def _dimensions(option: MigPlacementOption) -> dict[str, int]:
    """Capacity name -> what a GPU instance of `option`'s profile takes (multiprocessors and memory always;
    the engines where NVML gave the profile's attributes)."""
    taken = {"multiprocessors": option.multiprocessors}
    if option.attributes is not None:
        taken.update(zip((name for name, _ in _ENGINES), _engines(option.attributes), strict=True))
    taken["memory"] = option.memory_bytes
    return taken


def _counter(capacity: str) -> str:
    return dict(_ENGINES).get(capacity, capacity)


def _every_placement(gpu: Gpu) -> list[MigPlacementOption]:
    """NVML's placements of `gpu` and those its existing MIG devices occupy (the same, unless NVML does not
    list one of them)."""
    made = [
        _option_of(m) for m in gpu.mig_devices if m.placement is not None and m.gi_profile_info_id is not None
    ]
    return [*gpu.mig_placements, *made]


def memory_slices(gpu: Gpu) -> int:
    """How many memory slices `gpu`'s placements are counted in (NVML's count, or the last one any
    placement covers where it was not read)."""
    covered = max((o.start + o.size for o in _every_placement(gpu)), default=0)
    return max(gpu.mig_memory_slices, covered)


def gpu_counters(gpu: Gpu) -> Json:
    """The counters of `gpu`'s counter set: the whole GPU (what its largest profiles take, and each slice)."""
    totals: dict[str, int] = {}
    for option in _every_placement(gpu):
        for capacity, value in _dimensions(option).items():
            totals[capacity] = max(totals.get(capacity, 0), value)
    counters: Json = {_counter(c): {"value": _value(c, v)} for c, v in totals.items()}
    counters.update({memory_slice_counter(i): {"value": "1"} for i in range(memory_slices(gpu))})
    return counters


def counter_set(gpu: Gpu) -> Json:
    """`gpu`'s entry in a slice's `sharedCounters`."""
    return {"name": counter_set_name(gpu), "counters": gpu_counters(gpu)}


def whole_gpu_consumption(gpu: Gpu) -> list[Json]:
    """What a whole-GPU device of `gpu` consumes where it is published beside its partitions: everything."""
    return [{"counterSet": counter_set_name(gpu), "counters": gpu_counters(gpu)}]


def placement_order(options: tuple[MigPlacementOption, ...]) -> list[MigPlacementOption]:
    """`options` in publishing order: profiles as NVML lists them, each profile's placements from the last
    start down. The scheduler gives each claim the first published device that fits, so small profiles
    fill the GPU from its last slice and leave the first ones, where the large profiles must start (on an
    A100 a 4g.40gb and a 7g.80gb only at 0), free longest: a 3g.40gb then goes to 4, and a 4g.40gb still
    fits beside it."""
    profiles = {gi: n for n, gi in enumerate(dict.fromkeys(o.gi_profile_id for o in options))}
    return sorted(options, key=lambda o: (profiles[o.gi_profile_id], -o.start))


def _value(capacity: str, value: int) -> str:
    return quantity(value) if capacity == "memory" else str(value)


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[0] + b[1] and b[0] < a[0] + a[1]


@dataclass(frozen=True)
class Partition:
    name: str = "mig"  # the type attribute: a partition is a MIG device to a claim, made or not
    device_class: str = MIG_CLASS

    def applies(self, gpu: Gpu) -> bool:
        """Whether `gpu` publishes partitions: in MIG mode, its placements known, and every MIG device on it
        placed (else which slices are free is unknown)."""
        placed = all(m.placement is not None and m.gi_profile_info_id is not None for m in gpu.mig_devices)
        return gpu.mig_enabled and bool(gpu.mig_placements) and placed

    def devices(self, gpu: Gpu) -> list[DraDevice]:
        """Every placement of `gpu` that no existing MIG device overlaps, then each existing MIG device as
        the placement it occupies, by name: profiles in NVML's order, each one's placements from the last
        start down (placement_order)."""
        if not self.applies(gpu):
            return []
        made = {(m.gi_profile_info_id, m.placement): m for m in gpu.mig_devices}
        taken = [m.placement for m in gpu.mig_devices if m.placement is not None]
        found: dict[str, DraDevice] = {}
        for option in placement_order(gpu.mig_placements):
            where = (option.start, option.size)
            mig = made.pop((option.gi_profile_id, where), None)
            if mig is None and any(_overlaps(where, t) for t in taken):
                continue
            name = mig_device_name(gpu, option.profile, option.gi_profile_id, option.start)
            found.setdefault(name, DraDevice(name, gpu, mig, self, option))
        for mig in made.values():  # an instance at a placement NVML does not list: published as it is
            option = _option_of(mig)
            name = mig_device_name(gpu, option.profile, option.gi_profile_id, option.start)
            found.setdefault(name, DraDevice(name, gpu, mig, self, option))
        return list(found.values())

    def uuid(self, device: DraDevice) -> str:
        """The MIG device's UUID once it exists; "" for a placement not made yet."""
        return device.mig.uuid if device.mig is not None else ""

    def attributes(self, device: DraDevice) -> Json:
        option = _placement(device)
        attributes: Json = {"type": {"string": self.name}}
        if device.mig is not None:
            attributes["uuid"] = {"string": device.mig.uuid}
        attributes["parentUUID"] = {"string": device.gpu.uuid}
        attributes["profile"] = {"string": option.profile}
        return attributes

    def capacity(self, device: DraDevice) -> Json:
        option = _placement(device)
        capacity: Json = {c: {"value": _value(c, v)} for c, v in _dimensions(option).items()}
        for memory_slice in range(option.start, option.start + option.size):
            capacity[f"memorySlice{memory_slice}"] = {"value": "1"}
        return capacity

    def consumes_counters(self, device: DraDevice) -> list[Json]:
        """Its profile's capacities and exactly the memory slices of its placement, from its GPU's set."""
        option = _placement(device)
        counters: Json = {_counter(c): {"value": _value(c, v)} for c, v in _dimensions(option).items()}
        for memory_slice in range(option.start, option.start + option.size):
            counters[memory_slice_counter(memory_slice)] = {"value": "1"}
        return [{"counterSet": counter_set_name(device.gpu), "counters": counters}]

    def advertised(self, device: DraDevice) -> AdvertisedDevice:
        if device.mig is None:  # made at Prepare, which this daemon does not do yet
            raise ValueError(
                f"DRA device {device.name} is a MIG placement on {device.gpu.label} with no MIG device made "
                "yet; this daemon does not create MIG devices at Prepare"
            )
        return mig_device(device.gpu, device.mig)


def _placement(device: DraDevice) -> MigPlacementOption:
    if device.placement is None:  # a bug: only this kind makes its devices, each with its placement
        raise ValueError(f"DRA device {device.name} is a MIG partition but has no placement")
    return device.placement


def _option_of(mig: MigDevice) -> MigPlacementOption:
    """The placement an existing MIG device occupies, from what NVML said of the device itself."""
    if mig.placement is None or mig.gi_profile_info_id is None:  # a bug: Partition.applies checks both
        raise ValueError(f"{mig.label} has no placement to publish it as a MIG partition")
    start, size = mig.placement
    multiprocessors = mig.attributes.multiprocessors if mig.attributes is not None else 0
    return MigPlacementOption(
        mig.profile, mig.gi_profile_info_id, start, size, mig.memory_bytes, multiprocessors, mig.attributes
    )


PARTITION = Partition()


def consumes_counters(device: DraDevice) -> list[Json]:
    """What `device` consumes of its GPU's counter set: a partition its placement, any other kind nothing."""
    return device.kind.consumes_counters(device) if isinstance(device.kind, Partition) else []
