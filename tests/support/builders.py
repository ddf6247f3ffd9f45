"""Advertised devices built by hand, for unit tests that do not go through build_resources."""

from __future__ import annotations

from nvidia_device_plugin.plans.resources import AdvertisedDevice, replica_id

GIB = 1024**3


def gpu_device(
    uuid: str, index: int, replica: int | None = None, numa: int | None = 0, memory: int = 80 * GIB
) -> AdvertisedDevice:
    """A whole GPU, or replica `replica` of it."""
    return AdvertisedDevice(
        id=uuid if replica is None else replica_id(uuid, replica),
        kind="gpu",
        physical_uuid=uuid,
        gpu_uuid=uuid,
        gpu_index=index,
        mig_index=None,
        replica=replica,
        numa_node=numa,
        memory_bytes=memory,
    )


def mig_device(
    uuid: str,
    parent: str,
    gpu_index: int,
    mig_index: int,
    replica: int | None = None,
    numa: int | None = 0,
    memory: int = 10 * GIB,
) -> AdvertisedDevice:
    """A MIG device of GPU `parent`, or replica `replica` of it."""
    return AdvertisedDevice(
        id=uuid if replica is None else replica_id(uuid, replica),
        kind="mig",
        physical_uuid=uuid,
        gpu_uuid=parent,
        gpu_index=gpu_index,
        mig_index=mig_index,
        replica=replica,
        numa_node=numa,
        memory_bytes=memory,
    )
