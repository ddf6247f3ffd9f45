"""Kubelet's limit on one ListAndWatch message, checked before a plan is served (and by check-config).

Its own module so that `check-config` can apply the limit without loading the pipeline (NVML, CDI, serving).
"""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.v1 import RESOURCE_PREFIX, Config
from nvidia_device_plugin.plans.resources import ResourcePlan

# Kubelet dials plugins without raising grpc-go's default receive limit: a ListAndWatch message over it
# is dropped by kubelet, and the resource silently falls to 0 devices on the node.
KUBELET_RECEIVE_LIMIT = 4 * 1024 * 1024
# What check-config assumes about a node it cannot see: the largest GPU count of current servers (HGX and
# DGX boards carry 8; some PCIe servers 16), and 7 MIG devices per GPU for a MIG resource.
CHECK_CONFIG_MAX_GPUS = 16
CHECK_CONFIG_MAX_MIG_PER_GPU = 7
# One advertised replica at its largest on the wire: a MIG UUID replica ID, "Unhealthy", a NUMA node.
_WORST_DEVICE = pb.Device(ID="MIG-" + "0" * 36 + "::4095", health="Unhealthy")
_WORST_DEVICE.topology.nodes.add(ID=7)
# Bytes one device adds to a ListAndWatchResponse at most (the field tag and length included).
_DEVICE_ENTRY_BYTES = pb.ListAndWatchResponse(devices=[_WORST_DEVICE]).ByteSize()


def check_device_list_sizes(plans: Sequence[ResourcePlan]) -> None:
    """Refuse plans whose ListAndWatch message kubelet would drop (over its 4 MiB receive limit)."""
    for plan in plans:
        worst = len(plan.devices) * _DEVICE_ENTRY_BYTES
        if worst <= KUBELET_RECEIVE_LIMIT:
            continue
        size = pb.ListAndWatchResponse(
            devices=[_wire_device(d.id, d.numa_node) for d in plan.devices]
        ).ByteSize()
        if size > KUBELET_RECEIVE_LIMIT:
            raise ConfigError(
                f"{plan.name} would advertise {len(plan.devices)} devices in a ListAndWatch message of "
                f"{size:,} bytes, over kubelet's {KUBELET_RECEIVE_LIMIT:,}-byte gRPC receive limit (kubelet "
                "would drop the list and see 0 devices); lower the replicas or share fewer devices"
            )


def check_config_device_lists(config: Config) -> None:
    """check-config's version of check_device_list_sizes, for a node it cannot see (the largest one likely).

    A shared resource advertises replicas x devices; the devices are assumed to be
    CHECK_CONFIG_MAX_GPUS GPUs, or 7 MIG devices on each of them for a MIG resource (nvidia.com/gpu too
    under migStrategy single, which advertises MIG devices under that name).
    """
    sharing = config.sharing
    entries = [*sharing.time_slicing.resources, *(sharing.mps.resources if sharing.mps else ())]
    single = config.flags.mig_strategy == "single"
    for i, entry in enumerate(entries):
        mig = "/mig-" in entry.name or (single and entry.name == f"{RESOURCE_PREFIX}/gpu")
        devices = CHECK_CONFIG_MAX_GPUS * (CHECK_CONFIG_MAX_MIG_PER_GPU if mig else 1)
        if entry.devices.count is not None:
            devices = min(devices, entry.devices.count)
        elif entry.devices.refs:
            devices = min(devices, len(entry.devices.refs))
        size = devices * entry.replicas * _DEVICE_ENTRY_BYTES
        if size > KUBELET_RECEIVE_LIMIT:
            section = "timeSlicing" if i < len(sharing.time_slicing.resources) else "mps"
            raise ConfigError(
                f"sharing.{section} resource {entry.name} with replicas: {entry.replicas} would advertise "
                f"up to {devices * entry.replicas:,} devices ({size:,} bytes in one ListAndWatch message) on "
                f"a node with {CHECK_CONFIG_MAX_GPUS} GPUs{' of 7 MIG devices each' if mig else ''}, over "
                f"kubelet's {KUBELET_RECEIVE_LIMIT:,}-byte gRPC receive limit; lower the replicas "
                "(check-config --simulate NODE checks one node)"
            )


def _wire_device(device_id: str, numa_node: int | None) -> pb.Device:
    device = pb.Device(ID=device_id, health="Unhealthy")
    if numa_node is not None:
        device.topology.nodes.add(ID=numa_node)
    return device
