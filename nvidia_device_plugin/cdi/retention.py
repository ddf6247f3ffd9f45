"""CDI names that must stay defined after the config stops serving them, because kubelet may replay them.

Kubelet keeps every Allocate response it got in its device-manager checkpoint (`kubelet_internal_checkpoint`
in the device-plugin directory, which survives our restarts and kubelet's) and hands the same response
to the runtime on every restart of the container, for as long as the pod is on the node. So when a reload
stops serving a CDI name (cdi-cri -> envvar, deviceIDStrategy uuid -> index, a MIG layout change), a
running pod still names it and its next container restart fails if no spec defines it.

The rule: a name a spec of ours defined stays defined (its device entry kept, beside the current ones)
while any Allocate response in kubelet's checkpoint names it; once none does, no container can be given
it again, and it goes at the next publish (a reload). The checkpoint is the exact record (the
pod-resources API lists device IDs, not the CDI names a response carried). Without a checkpoint file
(no kubelet manages the directory) no name is in use; a checkpoint that cannot be read keeps every name.
"""

from __future__ import annotations

import base64
import binascii
import copy
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from google.protobuf.message import DecodeError

from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.base.boundedio import read_bytes
from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiError, CdiSpec
from nvidia_device_plugin.cdi.version import minimum_version

CHECKPOINT_FILE = "kubelet_internal_checkpoint"
MAX_CHECKPOINT_BYTES = 32 * 1024 * 1024
MAX_SPEC_BYTES = 16 * 1024 * 1024


def names_in_use(checkpoint: Path) -> frozenset[str]:
    """Our CDI names in the Allocate responses of kubelet's checkpoint; empty without the file.

    Raises CdiError when the checkpoint exists but cannot be read or understood.
    """
    try:
        data = read_bytes(checkpoint, MAX_CHECKPOINT_BYTES)
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:
        raise CdiError(f"cannot read kubelet's checkpoint {checkpoint}: {exc.strerror or exc}") from exc
    try:
        entries = json.loads(data)["Data"]["PodDeviceEntries"] or []
        responses = [_response(entry["AllocResp"]) for entry in entries if entry.get("AllocResp")]
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, DecodeError) as exc:
        raise CdiError(
            f"kubelet's checkpoint {checkpoint} is not in the format kubelet writes: {exc}"
        ) from exc
    names: set[str] = set()
    for response in responses:
        names.update(d.name for d in response.cdi_devices)
        for value in response.annotations.values():
            names.update(value.split(","))
    return frozenset(n for n in names if n.startswith(CDI_VENDOR + "/"))


def _response(encoded: str) -> api_pb2.ContainerAllocateResponse:
    """Kubelet stores each response as the protobuf bytes of ContainerAllocateResponse, base64 in JSON."""
    return api_pb2.ContainerAllocateResponse.FromString(base64.b64decode(encoded, validate=True))


def retain(
    previous: Mapping[str, dict[str, Any]], specs: Sequence[CdiSpec], in_use: frozenset[str] | None
) -> tuple[tuple[CdiSpec, ...], tuple[str, ...]]:
    """`specs`, plus the devices of `previous` (file name -> document written before) that `specs` no
    longer define and kubelet may still hand out (named in `in_use`; every one when it is None).

    A kept device joins the current spec of its file (whose common edits are the node's now), or keeps
    its old document when the current config has no spec of that class. Returns the specs to write and
    the names kept for that reason.
    """
    current = {spec.file_name: spec for spec in specs}
    result = dict(current)
    kept: list[str] = []
    for file_name, document in sorted(previous.items()):
        kind = document["kind"]
        spec = current.get(file_name)
        defined = {d["name"] for d in spec.document["devices"]} if spec is not None else set()
        keep = [
            d
            for d in document["devices"]
            if d["name"] not in defined and (in_use is None or f"{kind}={d['name']}" in in_use)
        ]
        if not keep:
            continue
        base = copy.deepcopy(spec.document if spec is not None else document)
        base["devices"] = (
            [*base["devices"], *copy.deepcopy(keep)] if spec is not None else copy.deepcopy(keep)
        )
        base["cdiVersion"] = minimum_version(base)
        result[file_name] = CdiSpec(file_name=file_name, kind=kind, document=base)
        kept += [f"{kind}={d['name']}" for d in keep]
    return tuple(result.values()), tuple(kept)


def spec_document(text: bytes) -> dict[str, Any] | None:
    """A spec document of ours as read back from the spec directory; None when it is not one."""
    try:
        document = json.loads(text)
    except ValueError:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("kind"), str):
        return None
    devices = document.get("devices")
    if not isinstance(devices, list) or not all(
        isinstance(d, dict) and isinstance(d.get("name"), str) and isinstance(d.get("containerEdits"), dict)
        for d in devices
    ):
        return None
    return document
