"""Hand-made nodes and configs for unit tests of the resources step and its views (no NVML involved)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from nvidia_device_plugin.config.v1 import (
    Config,
    Flags,
    ReplicatedDevices,
    ReplicatedResource,
    ReplicatedResources,
    ResourcePattern,
    Resources,
    Sharing,
)
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.plans.resources import ResourcePlan

GIB = 1024**3
A100 = "NVIDIA A100-SXM4-80GB"
H100 = "NVIDIA H100 80GB HBM3"
T4 = "Tesla T4"
GPU = "nvidia.com/gpu"


# --- hand-made nodes -------------------------------------------------------------------------------------


def gpu_uuid(index: int) -> str:
    return f"GPU-{0xA0000000 + index:08x}-1111-4222-8333-{index:012x}"


def mig_uuid(gpu_index: int, mig_index: int) -> str:
    return f"MIG-{0xB0000000 + gpu_index * 16 + mig_index:08x}-1111-4222-8333-{gpu_index:06x}{mig_index:06x}"


def slice_memory(profile: str) -> int:
    return int(re.findall(r"(\d+)gb", profile)[-1]) * GIB


def make_gpu(
    index: int,
    name: str = A100,
    memory: int = 80 * GIB,
    numa: int | None = 0,
    mig: Sequence[str] | None = None,
) -> Gpu:
    """A GPU; `mig` lists its MIG devices' profiles (MIG mode on), None leaves MIG mode off."""
    uuid = gpu_uuid(index)
    migs = tuple(
        MigDevice(
            uuid=mig_uuid(index, m),
            index=m,
            parent_uuid=uuid,
            parent_index=index,
            profile=profile,
            memory_bytes=slice_memory(profile),
            gpu_instance_id=m + 1,
            compute_instance_id=0,
        )
        for m, profile in enumerate(mig or ())
    )
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        memory_bytes=memory,
        pci_bus_id=f"00000000:{index + 7:02x}:00.0",
        minor=index,
        numa_node=numa,
        mig_enabled=mig is not None,
        mig_devices=migs,
    )


def node(*gpus: Gpu) -> Inventory:
    return Inventory(gpus=tuple(gpus), driver_version="550.54.15", cuda_driver_version=12040)


def dgx_a100() -> Inventory:
    return node(*(make_gpu(i, numa=i // 4) for i in range(8)))


def mig_mixed_a100() -> Inventory:
    """GPU 0 and 1 in MIG mode with mixed profiles, GPU 2 whole."""
    return node(
        make_gpu(0, numa=0, mig=["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"]),
        make_gpu(1, numa=0, mig=["3g.40gb", "3g.40gb"]),
        make_gpu(2, numa=1),
    )


def mig_uniform_a100() -> Inventory:
    return node(make_gpu(0, numa=0, mig=["1g.10gb"] * 7), make_gpu(1, numa=1, mig=["1g.10gb"] * 7))


def mig_two_profiles() -> Inventory:
    """All GPUs in MIG mode, but not one profile."""
    return node(make_gpu(0, mig=["1g.10gb", "1g.10gb"]), make_gpu(1, mig=["2g.20gb"]))


def mig_without_devices() -> Inventory:
    return node(make_gpu(0, mig=["3g.40gb", "3g.40gb"]), make_gpu(1, mig=[]))


def a100_h100() -> Inventory:
    return node(
        make_gpu(0, A100, numa=0),
        make_gpu(1, A100, numa=0),
        make_gpu(2, H100, numa=1),
        make_gpu(3, H100, numa=1),
    )


def single_t4() -> Inventory:
    return node(make_gpu(0, T4, memory=16 * GIB, numa=None))


def empty_node() -> Inventory:
    return node()


# --- config builders ---------------------------------------------------------------------------------------


def config(
    mig: str = "none",
    gpus: Sequence[tuple[str, str]] = (),
    migs: Sequence[tuple[str, str]] = (),
    time_slicing: ReplicatedResources | None = None,
    mps: ReplicatedResources | None = None,
) -> Config:
    return Config(
        flags=Flags(mig_strategy=mig),
        resources=Resources(
            gpus=tuple(ResourcePattern(p, n) for p, n in gpus),
            mig=tuple(ResourcePattern(p, n) for p, n in migs),
        ),
        sharing=Sharing(time_slicing=time_slicing or ReplicatedResources(), mps=mps),
    )


def share(
    *entries: ReplicatedResource, rename_by_default: bool = False, fail: bool = False
) -> ReplicatedResources:
    return ReplicatedResources(
        rename_by_default=rename_by_default, fail_requests_greater_than_one=fail, resources=entries
    )


def entry(
    name: str = GPU, replicas: int = 2, rename: str | None = None, devices: ReplicatedDevices | None = None
) -> ReplicatedResource:
    return ReplicatedResource(
        name=name, replicas=replicas, rename=rename, devices=devices or ReplicatedDevices()
    )


def refs(*items: str) -> ReplicatedDevices:
    return ReplicatedDevices(all=False, refs=items)


def count(n: int) -> ReplicatedDevices:
    return ReplicatedDevices(all=False, count=n)


def layout(plans: Sequence[ResourcePlan]) -> dict[str, list[str]]:
    """Resource -> the physical devices behind its IDs, by index ("3", "0:1"), replicas as "3#1"."""
    return {
        plan.name: [dev.index_id + ("" if dev.replica is None else f"#{dev.replica}") for dev in plan.devices]
        for plan in plans
    }


def plan_named(plans: Sequence[ResourcePlan], name: str) -> ResourcePlan:
    (plan,) = [p for p in plans if p.name == name]
    return plan
