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
import re
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
# Kubelet's checkpoint nests 6 deep (document, Data, PodDeviceEntries, an entry, DeviceIDs, a NUMA list).
MAX_CHECKPOINT_DEPTH = 16
_STRING = re.compile(rb'"[^"]*"')  # after escapes are dropped: no backtracking, linear in the text
_NOT_SKELETON = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_SLICE = 64 * 1024
MAX_SPEC_BYTES = 16 * 1024 * 1024


def names_in_use(checkpoint: Path) -> frozenset[str]:
    """Our CDI names in the Allocate responses of kubelet's checkpoint; empty without the file.

    Raises CdiError when the checkpoint exists but cannot be read or understood (too big, nested deeper
    than kubelet writes, not JSON, not kubelet's layout).
    """
    try:
        data = read_bytes(checkpoint, MAX_CHECKPOINT_BYTES)
    except FileNotFoundError:
        return frozenset()
    except OSError as exc:
        raise CdiError(f"cannot read kubelet's checkpoint {checkpoint}: {exc.strerror or exc}") from exc
    try:
        _check_nesting(data)
        text = data.decode("utf-8")
        del data  # the text replaces the bytes: one copy of the file is held while it is parsed
        entries = _parse(text)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, DecodeError) as exc:
        raise CdiError(
            f"kubelet's checkpoint {checkpoint} is not in the format kubelet writes: {exc}"
        ) from exc
    names: set[str] = set()
    for entry in entries:
        names.update(entry.names)
    return frozenset(names)


class _Entry:
    """A pod-device entry reduced, as it is parsed, to the names of ours its Allocate response carries."""

    __slots__ = ("names",)

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names


_SKIPPED = _Entry(frozenset())  # an object the names do not come from (device ID maps): dropped at once


def _parse(text: str) -> list[_Entry]:
    """The checkpoint's pod-device entries. Each object is reduced as soon as it is parsed (an entry to its
    names, the device-ID maps to nothing), so the memory held is the text and one entry, not the whole tree.
    """
    document = json.loads(text, object_hook=_reduce)
    data = document.get("Data") if isinstance(document, dict) else None
    if not isinstance(data, dict) or "PodDeviceEntries" not in data:
        raise ValueError("it has no Data.PodDeviceEntries")
    entries = data["PodDeviceEntries"] or []
    if not isinstance(entries, list) or not all(isinstance(e, _Entry) for e in entries):
        raise ValueError("Data.PodDeviceEntries is not a list of pod-device entries")
    return entries


def _reduce(obj: dict[str, Any]) -> object:
    if "AllocResp" in obj:  # a pod-device entry (one container's devices of one resource)
        encoded = obj["AllocResp"]
        if not encoded:
            return _SKIPPED
        response = _response(encoded)
        found = {d.name for d in response.cdi_devices}
        for value in response.annotations.values():
            found.update(value.split(","))
        return _Entry(frozenset(n for n in found if n.startswith(CDI_VENDOR + "/")))
    # The document and its Data are kept; everything else (device-ID maps, an entry without a response)
    # is not needed and goes at once.
    return obj if "Data" in obj or "PodDeviceEntries" in obj else _SKIPPED


def _check_nesting(data: bytes) -> None:
    """ValueError when the JSON nests deeper than MAX_CHECKPOINT_DEPTH or its brackets do not pair.

    json.loads recurses once per level, and a small file nested 200,000 deep would end in RecursionError;
    this check costs a copy of the text's quotes and brackets (a few bytes a string), never recursion.
    Escapes are dropped first (escaped backslashes, then escaped quotes), so every quote left opens or
    closes a string, and the strings (with any bracket in them) go with them.
    """
    unescaped = data.replace(b"\\\\", b"").replace(b'\\"', b"")  # the same object when there are none
    skeleton = _brackets_outside_strings(unescaped)
    for _ in range(MAX_CHECKPOINT_DEPTH):
        if not skeleton:
            return
        inner_removed = skeleton.replace(b"[]", b"").replace(b"{}", b"")
        if inner_removed == skeleton:
            raise ValueError("its brackets do not pair up")
        skeleton = inner_removed
    if skeleton:
        raise ValueError(f"it nests deeper than {MAX_CHECKPOINT_DEPTH} levels (kubelet writes 6)")


def _brackets_outside_strings(text: bytes) -> bytes:
    """The brackets of `text` (without escapes) that are not inside a string, in order.

    Done a slice at a time, so the copies made on the way stay small whatever the file's size:
    translate() allocates its whole input's size before it shrinks, and re.sub keeps a piece per match.
    Each slice ends after an even number of quotes, so no string is cut in two.
    """
    parts: list[bytes] = []
    start = 0
    while start < len(text):
        end = min(start + _SLICE, len(text))
        quotes_and_brackets = text[start:end].translate(None, _NOT_SKELETON)
        if quotes_and_brackets.count(b'"') % 2:  # a string runs on: take the slice to its closing quote
            closing = text.find(b'"', end)
            end = len(text) if closing < 0 else closing + 1
            quotes_and_brackets = text[start:end].translate(None, _NOT_SKELETON)
        parts.append(_STRING.sub(b"", quotes_and_brackets))
        start = end
    return b"".join(parts)


def _response(encoded: object) -> api_pb2.ContainerAllocateResponse:
    """Kubelet stores each response as the protobuf bytes of ContainerAllocateResponse, base64 in JSON."""
    if not isinstance(encoded, str):
        raise TypeError(f"AllocResp is a {type(encoded).__name__}, not base64 text")
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
