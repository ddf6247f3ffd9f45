"""Our labels beyond GFD's, under `nvdp.nvidia.com/`: the NVLink/NVSwitch domain, the NUMA layout of the
GPUs and how many GPUs are healthy now.

The prefix is a subdomain of `nvidia.com`, so it is kept apart from GFD's keys (no selector written for GFD
can match one by accident) and admitted wherever NFD admits GFD's labels (NFD older than v0.14 needs
`nvdp.nvidia.com` in `-extra-label-ns`, next to `nvidia.com`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Sequence

from nvidia_device_plugin.devices import Gpu, Inventory, link_groups

OUR_PREFIX = "nvdp.nvidia.com/"


def topology_labels(inventory: Inventory, unhealthy: Collection[str] = ()) -> dict[str, str]:
    """NVLink, NVSwitch, NUMA and health labels; {} on a node without GPUs.

    `unhealthy` holds the physical UUIDs the health registry has marked; a lost GPU is never healthy.
    """
    gpus = inventory.gpus
    if not gpus:
        return {}
    labels = {
        "gpu.healthy": str(sum(1 for g in gpus if not g.lost and g.uuid not in unhealthy)),
        "nvswitch": _bool(any(g.nvswitch_links > 0 for g in gpus)),
        "nvlink.domain-size": str(_largest_nvlink_domain(inventory)),
    }
    if len(gpus) >= 2:
        labels["nvlink.fully-connected"] = _bool(
            all(_linked(inventory, a, b) for i, a in enumerate(gpus) for b in gpus[i + 1 :])
        )
    numa = _gpus_per_numa_node(gpus)
    if numa is not None:
        labels["numa.nodes"] = str(len(numa))
        labels["numa.gpus-per-node"] = "-".join(str(n) for n in numa)
    return {OUR_PREFIX + key: value for key, value in labels.items()}


def _linked(inventory: Inventory, a: Gpu, b: Gpu) -> bool:
    link = inventory.link(a.index, b.index)
    return link is not None and link.nvlinks > 0


def _largest_nvlink_domain(inventory: Inventory) -> int:
    """GPUs in the largest set reachable from one another over NVLink (directly or via NVSwitch)."""
    groups = link_groups(inventory, lambda link: link.nvlinks > 0)
    return max(Counter(groups.values()).values())


def _gpus_per_numa_node(gpus: Sequence[Gpu]) -> list[int] | None:
    """GPU counts per NUMA node, by node ID; None when any GPU's NUMA node is unknown."""
    counts: dict[int, int] = {}
    for gpu in gpus:
        if gpu.numa_node is None:
            return None
        counts[gpu.numa_node] = counts.get(gpu.numa_node, 0) + 1
    return [counts[node] for node in sorted(counts)]


def _bool(value: bool) -> str:
    return "true" if value else "false"
