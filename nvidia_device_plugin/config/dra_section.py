"""The `dra` section of a document -> config.dra.Dra (the types live there, so config.v1 can hold one)."""

from __future__ import annotations

import re
from typing import Literal

from nvidia_device_plugin.config.document import Invalid, fail, fail_type, show
from nvidia_device_plugin.config.dra import ALL_GPUS, Dra
from nvidia_device_plugin.config.schema import Section

DRA_FIELDS = ("enabled", "gpus", "dynamicMig")
_INDEX = re.compile(r"[0-9]+")
_UUID = re.compile(r"gpu-[0-9a-f-]+", re.IGNORECASE)


def parse_dra(s: Section) -> Dra:
    return Dra(
        enabled=s.get_bool("enabled", False),
        gpus=_gpu_refs(s.raw("gpus"), s.path_of("gpus")),
        dynamic_mig=s.get_bool("dynamicMig", False),
    )


def _gpu_refs(value: object, path: str) -> Literal["all"] | tuple[str, ...]:
    """`all`, or GPU refs: from a YAML list, or the list a flag gives (["all"] or ["0", "1"])."""
    if value is None or (isinstance(value, str) and value.lower() == ALL_GPUS):
        return ALL_GPUS
    if not isinstance(value, list):
        fail_type(path, "'all' or a list of GPU indices and UUIDs", value)
    if [str(v).lower() for v in value] == [ALL_GPUS]:
        return ALL_GPUS
    refs: list[str] = []
    for i, item in enumerate(value):
        refs.append(_gpu_ref(item, f"{path}[{i}]"))
    if len(set(refs)) != len(refs):
        duplicate = next(r for r in refs if refs.count(r) > 1)
        fail(path, f"lists GPU {duplicate} twice")
    return tuple(refs)


def _gpu_ref(item: object, path: str) -> str:
    if isinstance(item, int) and not isinstance(item, bool) and item >= 0:
        return str(item)
    if isinstance(item, str) and _INDEX.fullmatch(item.strip()):
        return str(int(item.strip()))
    if isinstance(item, str) and _UUID.fullmatch(item.strip()):
        return item.strip().lower()
    if isinstance(item, str) and (":" in item or item.strip().upper().startswith("MIG-")):
        raise Invalid(
            path,
            f"{path}: DRA owns whole GPUs (a GPU's MIG devices go with it), got the MIG device {show(item)}",
        )
    fail_type(path, "a GPU index or a GPU UUID", item)
