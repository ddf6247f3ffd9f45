"""What the CDI tests share: the CDI spec schema every written spec is checked against, and builders.

CDI_SPEC_SCHEMA is written from the CDI specification's documented fields (SPEC.md: cdiVersion, kind,
devices[].name / containerEdits, containerEdits' env, deviceNodes, mounts, hooks); unknown fields are
refused, as the CDI library refuses them when it loads a spec.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import jsonschema

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiSpec
from nvidia_device_plugin.config.v1 import (
    Config,
    DeviceIdStrategy,
    Flags,
    PluginFlags,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
)
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.snapshot import Snapshot, build_snapshot

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
_PATH = {"type": "string", "pattern": "^/"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_UINT32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}
_DEVICE_NODE = {
    "type": "object",
    "required": ["path"],
    "additionalProperties": False,
    "properties": {
        "path": _PATH,
        "hostPath": _PATH,
        "type": {"enum": ["b", "c", "u", "p"]},
        "major": {"type": "integer"},
        "minor": {"type": "integer"},
        "fileMode": _UINT32,
        "permissions": {"type": "string", "pattern": "^[rwm]{1,3}$"},
        "uid": _UINT32,
        "gid": _UINT32,
    },
}
_MOUNT = {
    "type": "object",
    "required": ["hostPath", "containerPath"],
    "additionalProperties": False,
    "properties": {
        "hostPath": {"type": "string"},
        "containerPath": _PATH,
        "options": _STRINGS,
        "type": {"type": "string"},
    },
}
_HOOK = {
    "type": "object",
    "required": ["hookName", "path"],
    "additionalProperties": False,
    "properties": {
        "hookName": {
            "enum": [
                "prestart",
                "createRuntime",
                "createContainer",
                "startContainer",
                "poststart",
                "poststop",
            ]
        },
        "path": _PATH,
        "args": _STRINGS,
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "timeout": {"type": "integer", "minimum": 1},
    },
}
_EDITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "deviceNodes": {"type": "array", "items": _DEVICE_NODE},
        "mounts": {"type": "array", "items": _MOUNT},
        "hooks": {"type": "array", "items": _HOOK},
        "additionalGids": {"type": "array", "items": _UINT32},
    },
}
CDI_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["cdiVersion", "kind", "devices"],
    "additionalProperties": False,
    "properties": {
        # Versions containerd >= 1.7 and CRI-O >= 1.23 load; hostPath on device nodes needs >= 0.5.0.
        "cdiVersion": {"enum": ["0.5.0", "0.6.0", "0.7.0", "0.8.0"]},
        "kind": {
            "type": "string",
            "pattern": r"^[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]/[A-Za-z0-9][A-Za-z0-9_.-]*$",
        },
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "containerEdits"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": _NAME},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                    # A device without edits is refused by the CDI library.
                    "containerEdits": {**_EDITS, "minProperties": 1},
                },
            },
        },
        "containerEdits": _EDITS,
    },
}


def assert_valid_spec(document: dict[str, Any]) -> None:
    jsonschema.validate(document, CDI_SPEC_SCHEMA)
    names = [d["name"] for d in document["devices"]]
    assert len(names) == len(set(names)), f"device names repeat: {names}"


def cdi_config(
    *strategies: str,
    ids: DeviceIdStrategy = "uuid",
    mig: str = "none",
    replicas: int = 0,
    **plugin: Any,
) -> Config:
    sharing = Sharing()
    if replicas:
        sharing = Sharing(
            time_slicing=ReplicatedResources(resources=(ReplicatedResource("nvidia.com/gpu", replicas),))
        )
    flags_plugin = PluginFlags(
        device_list_strategy=strategies or ("cdi-cri",), device_id_strategy=ids, **plugin
    )  # type: ignore[arg-type]
    return Config(flags=Flags(mig_strategy=mig, plugin=flags_plugin), sharing=sharing)  # type: ignore[arg-type]


def snapshot_of(sessions: list[NvmlSession], node: str, config: Config) -> Snapshot:
    session = open_nvml(node)
    sessions.append(session)
    return build_snapshot(session, config)


def gpu_spec(snapshot: Snapshot) -> CdiSpec:
    assert snapshot.cdi is not None and snapshot.cdi.problem is None, snapshot.cdi
    [spec] = [s for s in snapshot.cdi.specs if s.kind == f"{CDI_VENDOR}/gpu"]
    assert_valid_spec(spec.document)
    return spec


def by_name(spec: CdiSpec) -> dict[str, list[str]]:
    return {
        d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec.document["devices"]
    }


def defined_names(directory: Path) -> set[str]:
    """Every CDI device name the spec files in `directory` define, each file checked against the schema."""
    names: set[str] = set()
    for name in os.listdir(directory):
        document = json.loads((directory / name).read_text())
        assert_valid_spec(document)
        names |= {f"{document['kind']}={d['name']}" for d in document["devices"]}
    return names


def kubelet_checkpoint(
    path: Path, admitted: list[tuple[str, str, list[str], pb.ContainerAllocateResponse]]
) -> None:
    """Write kubelet's device-manager checkpoint as kubelet (v1.20+) writes it, for the admitted containers
    (pod UID, resource, device IDs, the Allocate response kubelet keeps and replays on restarts)."""
    entries = [
        {
            "PodUID": pod,
            "ContainerName": "main",
            "ResourceName": resource,
            "DeviceIDs": {"-1": ids},
            "AllocResp": base64.b64encode(response.SerializeToString()).decode(),
        }
        for pod, resource, ids, response in admitted
    ]
    registered: dict[str, list[str]] = {}
    for _, resource, ids, _ in admitted:
        registered.setdefault(resource, []).extend(ids)
    document = {"Data": {"PodDeviceEntries": entries, "RegisteredDevices": registered}, "Checksum": 0}
    path.write_text(json.dumps(document))
