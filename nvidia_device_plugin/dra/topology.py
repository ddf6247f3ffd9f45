"""Which GPUs share an NVLink domain or a PCIe switch, as DRA attributes `matchAttribute` can compare.

Our preferred allocation packs a multi-GPU request onto GPUs joined by NVLink, then by PCIe switch
(serving/preferred_gpus.py); DRA has no preferred allocation, so a claim says the same with a
constraint: `matchAttribute: gpu.nvidia.com/nvlinkDomain` (every device of the request in one NVLink
domain) or `gpu.nvidia.com/pcieSwitch`. Both are read from the inventory's links:

* nvlinkDomain: GPUs connected by NVLink, directly or through NVSwitches, transitively; named after the
  lowest GPU minor in it ("nvlink-0"). A GPU without NVLink has none (a constraint then fails for it, as
  it should: it shares a domain with no other GPU).
* pcieSwitch: GPUs on one board or behind one PCIe switch (PcieLevel INTERNAL or SINGLE), transitively;
  every GPU has one ("pcie-4" for a GPU alone behind its root port).

Names are per node (a claim's devices come from one node), and stable while the links are.
"""

from __future__ import annotations

from nvidia_device_plugin.devices import Inventory, PcieLevel, link_groups


def nvlink_domains(inventory: Inventory) -> dict[int, str]:
    """GPU index -> its NVLink domain, for the GPUs that have NVLink to another GPU."""
    linked = {i for link in inventory.links if link.nvlinks > 0 for i in (link.a, link.b)}
    groups = link_groups(inventory, lambda link: link.nvlinks > 0)
    return {index: f"nvlink-{minor}" for index, minor in groups.items() if index in linked}


def pcie_switches(inventory: Inventory) -> dict[int, str]:
    """GPU index -> the PCIe switch group it sits in (every GPU)."""
    groups = link_groups(inventory, lambda link: link.pcie <= PcieLevel.SINGLE)
    return {index: f"pcie-{minor}" for index, minor in groups.items()}
