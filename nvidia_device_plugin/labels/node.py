"""A node's labels: GFD's set, our additions, and the timestamp, from one snapshot and the health registry.

`node_labels` is pure: the same inventory, config, unhealthy set and timestamp always give the same labels.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.labels.gfd import PREFIX, gfd_labels
from nvidia_device_plugin.labels.topology import topology_labels

TIMESTAMP_LABEL = PREFIX + "gfd.timestamp"


@dataclass(frozen=True)
class LabelSettings:
    """What GFD takes from its flags rather than from the node."""

    no_timestamp: bool = False
    machine_type: str = "unknown"  # the machine type file's text (GFD: /sys/class/dmi/id/product_name)


def node_labels(
    inventory: Inventory,
    config: Config,
    unhealthy: Collection[str] = (),
    settings: LabelSettings = LabelSettings(),
    timestamp: int | None = None,
) -> dict[str, str]:
    """Every label of the node, sorted by key; `gfd.timestamp` only with a timestamp and no no_timestamp."""
    labels = gfd_labels(inventory, config, settings.machine_type)
    labels.update(topology_labels(inventory, unhealthy))
    if timestamp is not None and not settings.no_timestamp:
        labels[TIMESTAMP_LABEL] = str(timestamp)
    return dict(sorted(labels.items()))


def without_timestamp(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k != TIMESTAMP_LABEL}
