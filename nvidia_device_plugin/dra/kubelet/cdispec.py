"""One CDI spec per prepared claim, made by the cdi/ package's own generation, and its file.

NVIDIA's DRA driver names a claim's devices `k8s.gpu.nvidia.com/claim=<claim UID>-<device>` and keeps them
in a transient spec per claim, `k8s.gpu.nvidia.com-claim_<claim UID>.json` (the CDI library's transient
spec name). The content comes from cdi/: `scan_node` reads the driver root and the device nodes of the
claim's devices, `generate_specs` builds the node's `gpu` spec for them, and the claim's spec takes that
spec's common edits (driver files, control nodes, hooks) and each device's own edits (its /dev/nvidia<N>
and DRM nodes, a MIG device's capability nodes) under the claim's names, at the lowest cdiVersion the
document needs. So a claim's container gets exactly what the
device plugin's CDI strategies give a pod for the same device.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.cdi.model import GPU_CLASS, CdiError, CdiSpec, cdi_kind
from nvidia_device_plugin.cdi.scan import scan_node
from nvidia_device_plugin.cdi.spec import generate_specs
from nvidia_device_plugin.cdi.version import minimum_version
from nvidia_device_plugin.cdi.writer import SPEC_FILE_MODE, spec_json
from nvidia_device_plugin.dra.kubelet.model import ClaimError, NodeDevices
from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.plans.resources import ResourcePlan

CLAIM_VENDOR = "k8s.gpu.nvidia.com"
CLAIM_CLASS = "claim"
CLAIM_KIND = f"{CLAIM_VENDOR}/{CLAIM_CLASS}"


def claim_device_name(claim_uid: str, device: str) -> str:
    return f"{claim_uid}-{device}"


def claim_cdi_id(claim_uid: str, device: str) -> str:
    """The fully qualified CDI name a prepared device gets: "k8s.gpu.nvidia.com/claim=<UID>-gpu-0"."""
    return f"{CLAIM_KIND}={claim_device_name(claim_uid, device)}"


def claim_spec_file(claim_uid: str) -> str:
    return f"{CLAIM_VENDOR}-{CLAIM_CLASS}_{claim_uid}.json"


def claim_spec(
    claim_uid: str, devices: Sequence[DraDevice], node: NodeDevices, extra: Mapping[str, Any] | None = None
) -> CdiSpec:
    """The spec defining `devices` (distinct, at least one) under claim `claim_uid`'s names; `extra`
    (containerEdits: `env`, `mounts`, e.g. an MPS client's) is added to the edits common to its devices.

    Raises ClaimError when the node lacks what the spec must name (driver files, device nodes).
    """
    advertised = [device.kind.advertised(device) for device in devices]
    settings = replace(node.cdi, device_id_strategy="uuid", extra_modes=())
    host = node.host
    driver_root = host.driver_root if host.driver_root is not None else Path(settings.container_driver_root)
    plan = ResourcePlan(CLAIM_KIND, tuple(advertised))
    try:
        scan = scan_node(node.inventory, advertised, driver_root, host)
        specs = generate_specs([plan], settings, scan)
    except CdiError as exc:
        raise ClaimError(f"cannot generate the claim's CDI spec: {exc}") from None
    gpu_spec = next((s for s in specs if s.kind == cdi_kind(GPU_CLASS)), None)
    if gpu_spec is None:
        raise ClaimError("cannot generate the claim's CDI spec: the node's spec defines none of its devices")
    edits = {entry["name"]: entry["containerEdits"] for entry in gpu_spec.document["devices"]}
    document: dict[str, Any] = {
        "cdiVersion": "",
        "kind": CLAIM_KIND,
        "devices": [
            {"name": claim_device_name(claim_uid, d.name), "containerEdits": copy.deepcopy(edits[d.uuid])}
            for d in devices
        ],
    }
    common = copy.deepcopy(gpu_spec.document.get("containerEdits") or {})
    for key, values in (extra or {}).items():
        common[key] = [*common.get(key, []), *copy.deepcopy(values)]
    if common:
        document["containerEdits"] = common
    document["cdiVersion"] = minimum_version(document)  # a UID may start with a digit: 0.5.0 at least
    return CdiSpec(file_name=claim_spec_file(claim_uid), kind=CLAIM_KIND, document=document)


def write_claim_spec(spec_dir: Path, spec: CdiSpec) -> None:
    """Put `spec` into `spec_dir` (made if missing) atomically; ClaimError naming the path on failure."""
    path = spec_dir / spec.file_name
    try:
        spec_dir.mkdir(parents=True, exist_ok=True)
        replace_file(path, spec_json(spec), SPEC_FILE_MODE)
    except OSError as exc:
        raise ClaimError(f"cannot write the claim's CDI spec {path}: {exc.strerror or exc}") from None


def remove_claim_spec(spec_dir: Path, claim_uid: str) -> bool:
    """Remove claim `claim_uid`'s spec; False when there was none. ClaimError when it cannot be removed."""
    path = spec_dir / claim_spec_file(claim_uid)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ClaimError(f"cannot remove the claim's CDI spec {path}: {exc.strerror or exc}") from None
    return True


def claim_spec_exists(spec_dir: Path, claim_uid: str) -> bool:
    return (spec_dir / claim_spec_file(claim_uid)).is_file()
