"""What the node's disk still says about DRA claims, so that no GPU goes back to the device plugin under one.

Pod-resources may not show a running claim: kubelet 1.34 and 1.35 report DRA claims there only with the
`KubeletPodResourcesDynamicResources` gate on. The kubelet plugin's checkpoint may not either: one found
corrupt at start was set aside as `<checkpoint>.corrupt` (dra/kubelet/checkpoint.py), and the claims it
listed are then unknown. Two records stay on disk, and the handover reads both before a GPU leaves DRA:

* the per-claim CDI specs (dra/kubelet/cdispec.py, `k8s.gpu.nvidia.com-claim_<UID>.json`): a spec exists
  from a claim's prepare until its unprepare, and each of its devices, `<UID>-<DRA device name>`, holds
  that device's GPU;
* the set-aside checkpoint: while `<checkpoint>.corrupt` is there, every GPU is held (the operator removes
  it once no pod uses a claim it may have listed; docs/dra.md).

A spec that cannot be read or understood, or a directory over the bounds below, also holds every GPU: the
answer is then "unknown", never "free". Every read is bounded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base.boundedio import read_bytes
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.dra.kubelet.cdispec import CLAIM_CLASS, CLAIM_VENDOR
from nvidia_device_plugin.dra.names import gpu_device_name, published_devices

# A claim's spec names its few devices and their edits: a few KiB (8 MIG devices with their nodes, ~20 KiB).
MAX_CLAIM_SPEC_BYTES = 1024 * 1024
MAX_CLAIM_SPECS = 1024  # a node prepares a few hundred claims at most
MAX_SPEC_DIR_ENTRIES = 16384  # /var/run/cdi holds every vendor's specs, a few dozen on a real node
_PREFIX = f"{CLAIM_VENDOR}-{CLAIM_CLASS}_"
_SUFFIX = ".json"


@dataclass(frozen=True)
class ClaimsOnDisk:
    """DRA device names the claim specs on disk name, and why every GPU must count as held (or None)."""

    devices: frozenset[str]
    unknown: str | None = None


def set_aside_checkpoint(checkpoint: Path) -> Path:
    """Where the kubelet plugin puts a checkpoint it could not use (dra/kubelet/checkpoint.py's name)."""
    return checkpoint.with_name(checkpoint.name + ".corrupt")


def claims_on_disk(spec_dir: Path, checkpoint: Path) -> ClaimsOnDisk:
    """What the claim specs in `spec_dir` and the checkpoint `checkpoint` say is still claimed."""
    aside = set_aside_checkpoint(checkpoint)
    if os.path.lexists(aside):
        return ClaimsOnDisk(
            frozenset(),
            f"the DRA checkpoint was unreadable and is set aside as {aside}: the claims it listed are "
            "unknown (remove that file once no pod on this node uses a DRA claim prepared before it)",
        )
    try:
        specs = _claim_specs(spec_dir)
        devices = {device for uid, path in specs for device in _spec_devices(uid, path)}
    except (OSError, ValueError) as exc:
        return ClaimsOnDisk(frozenset(), f"the DRA claim specs in {spec_dir} cannot be read: {exc}")
    return ClaimsOnDisk(frozenset(devices))


def gpus_of_devices(devices: Iterable[str], inventory: Inventory) -> frozenset[str]:
    """The GPUs of the DRA devices `devices`: a device published now, or, for one no longer published (a MIG
    layout changed under a claim), the GPU its name starts with (`gpu-<minor>`). Other names hold none."""
    names = published_devices(inventory)
    by_name = {gpu_device_name(g): g.uuid for g in inventory.gpus}
    held = set()
    for device in devices:
        if device in names:
            held.add(names[device].gpu.uuid)
            continue
        kind, _, rest = device.partition("-")
        minor = rest.partition("-")[0]
        if kind == "gpu" and minor.isdigit() and (uuid := by_name.get(f"gpu-{minor}")) is not None:
            held.add(uuid)
    return frozenset(held)


def _claim_specs(spec_dir: Path) -> list[tuple[str, Path]]:
    """(claim UID, path) of each claim spec in `spec_dir`; none when the directory does not exist."""
    found = []
    try:
        with os.scandir(spec_dir) as entries:
            for count, entry in enumerate(entries, 1):
                if count > MAX_SPEC_DIR_ENTRIES:
                    raise ValueError(f"more than {MAX_SPEC_DIR_ENTRIES} entries")
                if entry.name.startswith(_PREFIX) and entry.name.endswith(_SUFFIX):
                    found.append((entry.name[len(_PREFIX) : -len(_SUFFIX)], Path(entry.path)))
    except FileNotFoundError:
        return []
    if len(found) > MAX_CLAIM_SPECS:
        raise ValueError(f"{len(found)} claim specs, more than {MAX_CLAIM_SPECS}")
    return found


def _spec_devices(uid: str, path: Path) -> list[str]:
    """The DRA device names of claim `uid`'s spec at `path` (none once it is gone: unprepared meanwhile)."""
    try:
        document = json.loads(read_bytes(path, MAX_CLAIM_SPEC_BYTES))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    devices = document.get("devices") if isinstance(document, dict) else None
    if not isinstance(devices, list):
        raise ValueError(f"{path}: not a CDI spec (no devices list)")
    names = []
    for device in devices:
        name = device.get("name") if isinstance(device, dict) else None
        if not isinstance(name, str) or not name.startswith(f"{uid}-"):
            raise ValueError(f"{path}: a device named {name!r}, not <claim UID>-<device>")
        names.append(name.removeprefix(f"{uid}-"))
    return names
