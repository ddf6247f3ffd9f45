"""Showing a resource plan to a person (`plan` command table) or a program (JSON); pure, no printing.

`plan_to_json` returns, with these keys and no others, so scripts can rely on them:

    {
      "resources": [                      # sorted as given (build_resources sorts by name)
        {
          "name": "nvidia.com/gpu",       # fully qualified resource name
          "socket": "nvidia-gpu.sock",    # file name in the kubelet device-plugin directory
          "sharing": "time-slicing",      # "none" | "time-slicing" | "mps"
          "replicas": 4,                  # per physical device; 1 when not shared
          "fail_requests_greater_than_one": false,
          "device_count": 32,             # == len(devices)
          "devices": [
            {
              "id": "GPU-...::0",         # what kubelet sees
              "physical_uuid": "GPU-...", # GPU or MIG UUID behind it
              "gpu_uuid": "GPU-...",      # the physical GPU it lives on
              "gpu_index": 0,
              "mig_index": null,          # index among the GPU's MIG devices; null for whole GPUs
              "replica": 0,               # null when not shared
              "numa_node": 0,             # null when unknown
              "kind": "gpu",              # "gpu" | "mig"
              "memory_bytes": 85899345920 # of the physical device (GPU, or MIG slice), before sharing
            }
          ]
        }
      ],
      "gpus": [                           # every GPU discovered, by index, advertised or not
        {
          "index": 0, "uuid": "GPU-...", "name": "NVIDIA A100-SXM4-80GB", "memory_bytes": 85899345920,
          "pci_bus_id": "00000000:07:00.0", "numa_node": 0, "mig_enabled": false,
          "mig_devices": [{"index": 0, "uuid": "MIG-...", "profile": "1g.10gb", "memory_bytes": 10200547328}],
          "resources": ["nvidia.com/gpu"] # names its devices are advertised under, sorted
        }
      ]
    }

`plan --output json` adds three keys: "warnings", the list of every warning `run` would log about this node
and config (announce.py's notices, the same sentences); "nothing_advertised", why no resource is
advertised, or null when some are; and "cdi", the CDI specs (nvidia_device_plugin/cdi/view.py,
cdi_to_json), null without a CDI device-list strategy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan

_GIB = 1024**3
_COLUMNS = ("ID", "DEVICE", "UUID", "MODEL", "MEMORY", "NUMA")


def render_plan_table(plans: Sequence[ResourcePlan], inventory: Inventory, empty_reason: str = "") -> str:
    """One block per resource: a header line, then one aligned row per advertised device ID; without
    plans, the line saying so and why (`empty_reason`, announce.nothing_served_reason)."""
    if not plans:
        reason = empty_reason or "no GPUs found, or none match the configuration"
        return f"No resources to advertise: {reason}.\n"
    models = _model_names(inventory)
    blocks = []
    for plan in plans:
        rows = [_COLUMNS]
        rows += [
            (
                dev.id,
                dev.index_id,
                dev.physical_uuid,
                models.get(dev.physical_uuid, "?"),
                f"{dev.memory_bytes / _GIB:.1f} GiB",
                "-" if dev.numa_node is None else str(dev.numa_node),
            )
            for dev in plan.devices
        ]
        widths = [max(len(row[col]) for row in rows) for col in range(len(_COLUMNS))]
        lines = [_header(plan)]
        lines += [
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def plan_to_json(plans: Sequence[ResourcePlan], inventory: Inventory) -> dict[str, Any]:
    """The plan as JSON-serialisable data; the keys are documented in this module's docstring."""
    advertised_as: dict[str, set[str]] = {}
    resources = []
    for plan in plans:
        for dev in plan.devices:
            advertised_as.setdefault(dev.gpu_uuid, set()).add(plan.name)
        resources.append(
            {
                "name": plan.name,
                "socket": plan.socket_name,
                "sharing": plan.sharing,
                "replicas": plan.replicas,
                "fail_requests_greater_than_one": plan.fail_requests_greater_than_one,
                "device_count": len(plan.devices),
                "devices": [_device_json(dev) for dev in plan.devices],
            }
        )
    gpus = [
        _gpu_json(gpu, sorted(advertised_as.get(gpu.uuid, ())))
        for gpu in sorted(inventory.gpus, key=lambda g: g.index)
    ]
    return {"resources": resources, "gpus": gpus}


def _header(plan: ResourcePlan) -> str:
    physical = len({dev.physical_uuid for dev in plan.devices})
    count = f"{len(plan.devices)} device{'' if len(plan.devices) == 1 else 's'}"
    if physical != len(plan.devices):
        count += f" on {physical} physical"
    sharing = f"sharing={plan.sharing}"
    if sharing_mode(plan.sharing).shares_devices:
        sharing += f" replicas={plan.replicas}"
        if plan.fail_requests_greater_than_one:
            sharing += " max-request=1"
    return f"{plan.name}: {count}, {sharing}, socket={plan.socket_name}"


def _model_names(inventory: Inventory) -> dict[str, str]:
    """Physical UUID -> "NVIDIA A100-SXM4-80GB", or "NVIDIA A100-SXM4-80GB MIG 1g.10gb" for a MIG device."""
    names: dict[str, str] = {}
    for gpu in inventory.gpus:
        names[gpu.uuid] = gpu.name
        for mig in gpu.mig_devices:
            names[mig.uuid] = f"{gpu.name} MIG {mig.profile}"
    return names


def _device_json(dev: AdvertisedDevice) -> dict[str, Any]:
    return {
        "id": dev.id,
        "physical_uuid": dev.physical_uuid,
        "gpu_uuid": dev.gpu_uuid,
        "gpu_index": dev.gpu_index,
        "mig_index": dev.mig_index,
        "replica": dev.replica,
        "numa_node": dev.numa_node,
        "kind": dev.kind,
        "memory_bytes": dev.memory_bytes,
    }


def _gpu_json(gpu: Gpu, resources: list[str]) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "memory_bytes": gpu.memory_bytes,
        "pci_bus_id": gpu.pci_bus_id,
        "numa_node": gpu.numa_node,
        "mig_enabled": gpu.mig_enabled,
        "mig_devices": [_mig_json(mig) for mig in sorted(gpu.mig_devices, key=lambda m: m.index)],
        "resources": resources,
    }


def _mig_json(mig: MigDevice) -> dict[str, Any]:
    return {"index": mig.index, "uuid": mig.uuid, "profile": mig.profile, "memory_bytes": mig.memory_bytes}
