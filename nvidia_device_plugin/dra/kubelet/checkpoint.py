"""What the plugin has prepared, kept across restarts: one JSON file, replaced atomically.

Each claim goes through two states. PrepareStarted is written before the claim's CDI spec, PrepareCompleted
after it, so a daemon killed in between finds the claim started and prepares it again (writing the spec is
idempotent), and an unprepare finds it either way. A repeated prepare of a completed claim answers from
here, without asking the API again.

The file carries the boot ID (/proc/sys/kernel/random/boot_id) of the boot that wrote it. After a reboot
every claim is gone with the containers that used it (kubelet prepares them anew), so a file from another
boot is dropped as a whole, and the claims it held are returned for their specs to be removed. A file that
cannot be read or decoded is set aside as `<name>.corrupt` and the plugin starts empty: a claim it then
lacks is prepared again from the API, and its spec is found by name on unprepare.

A claim allocated dynamic-MIG placements also lists each MIG device made for it (`migInstances`, a
MigRecord each): "creating" is written before NVML is asked to make it, "made" (with its GPU and compute
instance IDs and UUID) once it exists, so a daemon stopped in between finds what it may have made
(dra/kubelet/dynamic_mig.py adopts or drops it at start).

Reads are bounded (MAX_CHECKPOINT_BYTES) and never block: O_NONBLOCK, a regular file only.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.base.boundedio import read_bytes
from nvidia_device_plugin.config.v1 import SHARING_MODES
from nvidia_device_plugin.dra.kubelet.model import ClaimRef, DraError, PreparedDevice, PreparedSharing

log = logging.getLogger(__name__)

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
FORMAT_VERSION = 1
# 10,000 claims of 8 devices each take a few MiB; a node holds a few hundred at most.
MAX_CHECKPOINT_BYTES = 16 * 1024 * 1024
_MAX_BOOT_ID_BYTES = 256
CHECKPOINT_FILE_MODE = 0o600  # names the node's claims; nobody else needs to read it

MigState = Literal["creating", "made"]
CREATING: MigState = "creating"
MADE: MigState = "made"

State = Literal["PrepareStarted", "PrepareCompleted"]
STARTED: State = "PrepareStarted"
COMPLETED: State = "PrepareCompleted"


@dataclass(frozen=True)
class MigRecord:
    """A MIG device made (or being made) for a claim at a dynamic-MIG placement: where, and what NVML made."""

    device: str  # the DRA device name of the placement, "gpu-0-mig-1g10gb-19-6"
    gpu_uuid: str
    gpu_index: int  # NVML's index (stable within a boot; the checkpoint does not outlive one)
    profile: str  # "1g.10gb"
    gi_profile_id: int  # NVML's GPU-instance profile ID
    start: int  # first memory slice of the placement
    size: int  # memory slices
    state: MigState
    gi_id: int = -1  # GPU instance ID, once made
    ci_id: int = -1  # compute instance ID, once made
    mig_uuid: str = ""  # "MIG-...", once made


@dataclass(frozen=True)
class Entry:
    """One claim in the checkpoint."""

    ref: ClaimRef
    state: State
    devices: tuple[PreparedDevice, ...] = ()
    sharing: tuple[PreparedSharing, ...] = ()  # what its opaque config set up, per GPU
    mig: tuple[MigRecord, ...] = ()  # the MIG devices made for it (dynamic MIG)


def read_boot_id(path: Path = BOOT_ID_PATH) -> str:
    """This boot's ID; DraError when it cannot be read (then reboots could not be told apart)."""
    try:
        text = read_bytes(path, _MAX_BOOT_ID_BYTES).decode("ascii").strip()
    except (OSError, UnicodeDecodeError, DraError) as exc:
        raise DraError(f"cannot read the boot ID from {path}: {exc}") from None
    if not text:
        raise DraError(f"the boot ID file {path} is empty")
    return text


class Checkpoint:
    """The claims this node has prepared (or started to), by UID; `save` after each change."""

    def __init__(self, path: Path, boot_id: str, entries: dict[str, Entry] | None = None) -> None:
        self.path = path
        self.boot_id = boot_id
        self._entries = dict(entries or {})

    @classmethod
    def load(cls, path: Path, boot_id: str) -> tuple[Checkpoint, tuple[Entry, ...]]:
        """The checkpoint at `path` for boot `boot_id`, and the entries dropped (a file of another boot)."""
        try:
            document = json.loads(read_bytes(path, MAX_CHECKPOINT_BYTES))
            written_by, entries = _decode(document)
        except FileNotFoundError:
            return cls(path, boot_id), ()
        except (OSError, ValueError, DraError) as exc:
            _set_aside(path, exc)
            return cls(path, boot_id), ()
        if written_by != boot_id:
            log.info(
                "DRA checkpoint %s was written before the node rebooted (boot ID %s, now %s): its %d "
                "claim(s) are forgotten",
                path,
                written_by,
                boot_id,
                len(entries),
            )
            return cls(path, boot_id), tuple(entries.values())
        return cls(path, boot_id, entries), ()

    def get(self, uid: str) -> Entry | None:
        return self._entries.get(uid)

    def put(self, uid: str, entry: Entry) -> None:
        self._entries[uid] = entry

    def pop(self, uid: str) -> Entry | None:
        return self._entries.pop(uid, None)

    def __iter__(self) -> Iterator[tuple[str, Entry]]:
        return iter(list(self._entries.items()))

    def save(self) -> None:
        """Write the file atomically; DraError naming the path when that fails."""
        claims = {uid: _encode_entry(entry) for uid, entry in self._entries.items()}
        document = {"version": FORMAT_VERSION, "bootID": self.boot_id, "claims": claims}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            replace_file(self.path, json.dumps(document, indent=1) + "\n", CHECKPOINT_FILE_MODE)
        except OSError as exc:
            raise DraError(f"cannot write the DRA checkpoint {self.path}: {exc.strerror or exc}") from None


def _set_aside(path: Path, problem: Exception) -> None:
    aside = path.with_name(path.name + ".corrupt")
    try:
        os.replace(path, aside)
        where = f"moved to {aside}"
    except OSError as exc:
        where = f"and could not be moved to {aside} ({exc.strerror or exc})"
    log.error(
        "DRA checkpoint %s cannot be used (%s); %s: starting with no prepared claims (kubelet's prepares "
        "read the claims from the API again)",
        path,
        problem,
        where,
    )


def _encode_entry(entry: Entry) -> dict[str, Any]:
    encoded = {
        "namespace": entry.ref.namespace,
        "name": entry.ref.name,
        "state": entry.state,
        "devices": [
            {
                "requests": list(d.requests),
                "pool": d.pool,
                "device": d.device,
                "cdiDeviceIDs": list(d.cdi_ids),
            }
            for d in entry.devices
        ],
        "sharing": [
            {
                "gpuUUID": s.gpu_uuid,
                "mode": s.mode,
                "interval": s.interval,
                "activeThreadPercentage": s.active_thread_percentage,
                "pinnedMemoryLimitMiB": s.pinned_memory_limit_mib,
            }
            for s in entry.sharing
        ],
    }
    if entry.mig:  # only a dynamic-MIG claim's entry has the key: the others read as before
        encoded["migInstances"] = [_encode_mig(m) for m in entry.mig]
    return encoded


def _encode_mig(record: MigRecord) -> dict[str, Any]:
    return {
        "device": record.device,
        "gpuUUID": record.gpu_uuid,
        "gpuIndex": record.gpu_index,
        "profile": record.profile,
        "giProfileID": record.gi_profile_id,
        "placementStart": record.start,
        "placementSize": record.size,
        "state": record.state,
        "giID": record.gi_id,
        "ciID": record.ci_id,
        "migUUID": record.mig_uuid,
    }


def _decode_mig(raw: Any) -> MigRecord:
    state = raw["state"]
    if state not in (CREATING, MADE):
        raise TypeError(f"unknown MIG instance state {state!r}")
    numbers = [raw[k] for k in ("gpuIndex", "giProfileID", "placementStart", "placementSize", "giID", "ciID")]
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        raise TypeError("a MIG instance's index, profile ID, placement or instance IDs are not integers")
    index, profile_id, start, size, gi_id, ci_id = numbers
    text = [_text(raw[k]) for k in ("device", "gpuUUID", "profile", "migUUID")]
    return MigRecord(text[0], text[1], index, text[2], profile_id, start, size, state, gi_id, ci_id, text[3])


def _decode(document: Any) -> tuple[str, dict[str, Entry]]:
    """(boot ID, entries) of a checkpoint document; ValueError naming what is wrong."""
    if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
        raise ValueError(f"not a version {FORMAT_VERSION} DRA checkpoint")
    boot_id, claims = document.get("bootID"), document.get("claims")
    if not isinstance(boot_id, str) or not isinstance(claims, dict):
        raise ValueError("bootID or claims missing")
    entries = {}
    for uid, raw in claims.items():
        try:
            state = raw["state"]
            if state not in (STARTED, COMPLETED):
                raise ValueError(f"claim {uid!r}: unknown state {state!r}")
            ref = ClaimRef(_text(raw["namespace"]), _text(raw["name"]), _text(uid))
            devices = tuple(
                PreparedDevice(
                    tuple(map(_text, d["requests"])),
                    _text(d["pool"]),
                    _text(d["device"]),
                    tuple(map(_text, d["cdiDeviceIDs"])),
                )
                for d in raw["devices"]
            )
            sharing = tuple(map(_decode_sharing, raw.get("sharing", [])))  # absent before opaque config
            mig = tuple(map(_decode_mig, raw.get("migInstances", [])))  # absent before dynamic MIG
        except (KeyError, TypeError) as exc:
            raise ValueError(f"claim {uid!r}: {exc!r}") from None
        entries[uid] = Entry(ref, state, devices, sharing, mig)
    return boot_id, entries


def _decode_sharing(raw: Any) -> PreparedSharing:
    mode = raw["mode"]
    if mode not in SHARING_MODES:
        raise TypeError(f"unknown sharing mode {mode!r}")
    interval, percentage, limit = raw["interval"], raw["activeThreadPercentage"], raw["pinnedMemoryLimitMiB"]
    if not all(v is None or isinstance(v, t) for v, t in ((interval, str), (percentage, int), (limit, int))):
        raise TypeError("interval, activeThreadPercentage or pinnedMemoryLimitMiB of the wrong type")
    return PreparedSharing(_text(raw["gpuUUID"]), mode, interval, percentage, limit)


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value
