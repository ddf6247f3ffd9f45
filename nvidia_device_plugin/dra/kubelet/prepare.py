"""NodePrepareResources and NodeUnprepareResources, claim by claim: the checkpoint, the API, the node's
devices and the claim's CDI spec, in that order.

Prepare of one claim: a claim the checkpoint has completed (and whose spec is in place) is answered from
the checkpoint. Otherwise the claim is read from the API and checked (claims.allocated_results), each of
this driver's results must name a device this node publishes, the claim is recorded as started, its spec
written, and it is recorded as completed. Unprepare removes the spec, then the entry; a claim never
prepared here (or forgotten at a reboot) is unprepared successfully, with nothing to do.

Every refusal is per claim (ClaimOutcome.error, the response map's `error`): the other claims of the call
are still prepared, kubelet retries the refused one and fails the pod's start meanwhile. NVIDIA's driver
fails the whole call instead; kubelet treats both as a failed prepare. A refusal is logged once per claim
and reason (kubelet retries every few seconds). Calls for different claims run in parallel; calls for the
same claim one at a time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.dra.kubelet.cdispec import (
    claim_cdi_id,
    claim_spec,
    claim_spec_exists,
    remove_claim_spec,
    write_claim_spec,
)
from nvidia_device_plugin.dra.kubelet.checkpoint import COMPLETED, MADE, STARTED, Checkpoint, Entry, MigRecord
from nvidia_device_plugin.dra.kubelet.claim_sharing import (
    ClaimSharing,
    GpuHolder,
    config_mps_edits,
    mps_edits,
    plan_sharing,
    refuse_config_mps,
    refuse_conflicts,
)
from nvidia_device_plugin.dra.kubelet.claims import AllocationResult, ClaimSource, allocation_of
from nvidia_device_plugin.dra.kubelet.dynamic_mig import DynamicMig, unmade
from nvidia_device_plugin.dra.kubelet.model import (
    ClaimError,
    ClaimOutcome,
    ClaimRef,
    DraError,
    NodeDevices,
    PreparedDevice,
    PreparedSharing,
)
from nvidia_device_plugin.dra.names import DraDevice

log = logging.getLogger(__name__)

_STRIPES = 64  # locks claims are spread over: one claim at a time, different claims mostly in parallel
_MAX_REMEMBERED_FAILURES = 1024  # refusals kept for log-once; beyond that the log starts afresh


class ClaimPreparer:
    """Prepares claims for driver `driver` from `claims` (the API), `node` (the devices now) and the
    checkpoint; specs go to `spec_dir`. `sharing` sets up what claims' opaque configs ask (time-slices, MPS
    control daemons); without it, a claim whose config asks for sharing is refused. `dynamic_mig` makes the
    MIG devices of claims allocated dynamic-MIG placements (dra/kubelet/dynamic_mig.py); without it, such a
    claim is refused."""

    def __init__(
        self,
        driver: str,
        claims: ClaimSource,
        node: Callable[[], NodeDevices | None],
        spec_dir: Path,
        checkpoint: Checkpoint,
        sharing: ClaimSharing | None = None,
        dynamic_mig: DynamicMig | None = None,
    ) -> None:
        self._driver = driver
        self._claims = claims
        self._node = node
        self._spec_dir = spec_dir
        self._checkpoint = checkpoint
        self._lock = threading.RLock()  # the checkpoint and its file
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._failures = FailureLog(log)
        self._sharing = sharing
        if sharing is not None:  # the control daemons of claims prepared before a restart: adopted
            sharing.resume((uid, entry.sharing) for uid, entry in checkpoint if entry.sharing)
        self._dynamic_mig = dynamic_mig
        if dynamic_mig is not None:
            self._adopt_mig(dynamic_mig)

    def _adopt_mig(self, dynamic_mig: DynamicMig) -> None:
        """The MIG devices made for claims before a restart: kept where they still are (dynamic_mig.py). A
        completed claim that lost one is made "started", so kubelet's next prepare of it makes it again."""
        with self._lock:
            claims = [(entry.ref, entry.mig) for _, entry in self._checkpoint if entry.mig]
            if not claims:
                return
            for uid, records in dynamic_mig.adopt(claims).items():
                entry = self._checkpoint.get(uid)
                if entry is not None and records != entry.mig:
                    lost = len({r.device for r in entry.mig if r.state == MADE} - {r.device for r in records})
                    state = STARTED if lost else entry.state
                    self._checkpoint.put(uid, replace(entry, state=state, mig=records))
            try:
                self._checkpoint.save()
            except DraError as exc:  # said now; the next prepare or unprepare that records says it again
                log.error("%s", exc)

    def close(self) -> None:
        """Stop supervising claims' control daemons (they keep running for a successor to adopt)."""
        if self._sharing is not None:
            self._sharing.close()

    # ---- the two calls ---------------------------------------------------------------------------

    def prepare(self, refs: Sequence[ClaimRef]) -> dict[str, ClaimOutcome]:
        """Each claim's devices or error, by UID."""
        outcomes = {}
        for ref in refs:
            outcomes[ref.uid] = self._guarded(ref, "prepare", self._prepare)
        return outcomes

    def unprepare(self, refs: Sequence[ClaimRef]) -> dict[str, str | None]:
        """Each claim's error, None where it was unprepared (or was not prepared here), by UID."""
        errors = {}
        for ref in refs:
            errors[ref.uid] = self._guarded(ref, "unprepare", self._unprepare).error
        return errors

    def prepared(self) -> dict[str, tuple[str, ...]]:
        """The device names of every claim prepared (or being prepared) here, by claim UID."""
        with self._lock:
            return {uid: tuple(d.device for d in entry.devices) for uid, entry in self._checkpoint}

    def made_mig(self) -> dict[str, tuple[str, ...]]:
        """The MIG devices made for claims here (dynamic MIG): their UUIDs by claim label."""
        with self._lock:
            return {
                e.ref.label: tuple(r.mig_uuid or r.device for r in e.mig)
                for _, e in self._checkpoint
                if e.mig
            }

    def made_mig_entries(self) -> list[Entry]:
        """The entries of claims that hold MIG devices made for them (dra/kubelet/stale_claims.py)."""
        with self._lock:
            return [entry for _, entry in self._checkpoint if entry.mig]

    def unprepare_lost(self, entry: Entry, why: str) -> bool:
        """Unprepare `entry`'s claim, which kubelet can no longer have (`why`), by kubelet's own Unprepare
        path: its MIG devices destroyed, its spec and entry removed. False, with nothing done, when the
        entry is no longer `entry` (a prepare or unprepare of kubelet's came first); DraError (the claim
        kept) when it cannot be unprepared."""
        ref = entry.ref
        with self._stripes[hash(ref.uid) % _STRIPES]:
            with self._lock:
                if self._checkpoint.get(ref.uid) != entry:
                    return False
            self._unprepare(ref)
        made = ", ".join(r.mig_uuid or r.device for r in entry.mig)
        log.warning("%s: %s; unprepared it, destroying MIG device(s) %s", ref.label, why, made)
        return True

    # ---- one claim -------------------------------------------------------------------------------

    def _guarded(
        self, ref: ClaimRef, what: str, work: Callable[[ClaimRef], ClaimOutcome | None]
    ) -> ClaimOutcome:
        """`work(ref)` holding the claim's lock; a refusal or a surprise becomes the claim's error."""
        key = f"{what} {ref.uid}"
        try:
            with self._stripes[hash(ref.uid) % _STRIPES]:
                outcome = work(ref) or ClaimOutcome()
        except DraError as exc:  # ClaimError included: a condition, said once per reason
            message = f"{what} of {ref.label} refused: {exc}"
            if len(self._failures) > _MAX_REMEMBERED_FAILURES:
                self._failures.clear_all()
            self._failures.report(key, message)
            return ClaimOutcome(error=message)
        except Exception as exc:  # a bug: this claim fails, the call and the server go on
            log.exception("%s of %s failed unexpectedly", what, ref.label)
            return ClaimOutcome(error=f"{what} of {ref.label} failed: internal error {exc!r}")
        self._failures.clear(key)
        return outcome

    def _prepare(self, ref: ClaimRef) -> ClaimOutcome:
        with self._lock:
            entry = self._checkpoint.get(ref.uid)
        if entry is not None and entry.state == COMPLETED:
            if not entry.devices or claim_spec_exists(self._spec_dir, ref.uid):
                return ClaimOutcome(entry.devices)
            log.warning("the CDI spec of %s is gone; preparing it again", ref.label)
        allocation = allocation_of(ref, self._claims.get(ref.namespace, ref.name), self._driver)
        node = self._node()
        if node is None:
            raise ClaimError("this node's devices are not known yet (no inventory has been served)")
        devices = _devices_named(self._driver, allocation.results, node.devices)
        sharing = plan_sharing(allocation.results, allocation.configs, node.devices)
        refuse_config_mps(sharing, node.config_sharing)
        mps_root = self._sharing.mps_root if self._sharing is not None else None
        claim_mps = [s for s in sharing if sharing_mode(s.mode).needs_control_daemon]
        extra = config_mps_edits(allocation.results, node.devices, node.config_sharing, claim_mps, mps_root)
        if sharing and self._sharing is None:
            raise ClaimError(
                "its opaque config asks for sharing, which this plugin was started without (no time-slice "
                "control or MPS root); remove the config from the claim or its DeviceClass"
            )
        if any(map(unmade, devices)) and self._dynamic_mig is None:
            names = ", ".join(d.name for d in devices if unmade(d))
            raise ClaimError(
                f"{names}: dynamic-MIG placement(s), whose MIG devices this plugin does not make (it was "
                "started without MIG management)"
            )
        prepared = _prepared_devices(ref.uid, allocation.results)
        made_before = entry.mig if entry is not None else ()
        self._record_started(Entry(ref, STARTED, prepared, sharing, made_before), node)
        if any(map(unmade, devices)):
            devices, node = self._make_mig(ref, devices, node)
        self._set_up(ref, sharing)
        if devices:
            if self._sharing is not None and claim_mps:
                extra = mps_edits(self._sharing.mps_root, ref.uid, sharing)
            write_claim_spec(self._spec_dir, claim_spec(ref.uid, devices, node, extra))
        self._record(ref.uid, Entry(ref, COMPLETED, prepared, sharing, self._mig_of(ref.uid)))
        log.info(
            "prepared %s: %s%s",
            ref.label,
            ", ".join(d.device for d in prepared) or "no device of this driver",
            "".join(f"; GPU {s.gpu_uuid} shared as {s.mode}" for s in sharing),
        )
        return ClaimOutcome(prepared)

    def _record_started(self, entry: Entry, node: NodeDevices) -> None:
        """Record `entry` (PrepareStarted) unless it conflicts with the sharing of a claim on its GPUs: the
        check and the record are one step, so two claims prepared at once cannot both pass it."""
        uid = entry.ref.uid

        def gpus(devices: Sequence[PreparedDevice]) -> frozenset[str]:
            return frozenset(node.devices[d.device].gpu.uuid for d in devices if d.device in node.devices)

        with self._lock:
            others = (GpuHolder(e.ref, gpus(e.devices), e.sharing) for u, e in self._checkpoint if u != uid)
            refuse_conflicts(gpus(entry.devices), entry.sharing, others)
            self._record(uid, entry)

    def _set_up(self, ref: ClaimRef, sharing: Sequence[PreparedSharing]) -> None:
        """Carry out `sharing`; when that fails, undo it and forget the claim (kubelet prepares it again)."""
        if not sharing or self._sharing is None:
            return
        try:
            self._sharing.apply(ref.uid, sharing)
        except DraError:
            try:
                self._sharing.release(ref.uid)
            except DraError as exc:  # the first failure is the claim's error; this one is said here
                log.warning("undoing the sharing of %s: %s", ref.label, exc)
            with self._lock:
                self._checkpoint.pop(ref.uid)
                self._checkpoint.save()
            raise

    def _make_mig(
        self, ref: ClaimRef, devices: Sequence[DraDevice], node: NodeDevices
    ) -> tuple[list[DraDevice], NodeDevices]:
        """`devices` with the MIG devices of their placements made; on failure the claim is forgotten
        unless a record of something made for it remains (its unprepare destroys that)."""
        if self._dynamic_mig is None:  # a bug: _prepare checks before recording the claim
            raise ClaimError("no MIG management")
        try:
            return self._dynamic_mig.make(
                ref, devices, node, self._mig_of(ref.uid), self._mig_saver(ref.uid), self._mig_owners(ref.uid)
            )
        except DraError:
            with self._lock:
                entry = self._checkpoint.get(ref.uid)
                if entry is not None and not entry.mig:
                    self._checkpoint.pop(ref.uid)
                    self._checkpoint.save()
            raise

    def _mig_of(self, uid: str) -> tuple[MigRecord, ...]:
        with self._lock:
            entry = self._checkpoint.get(uid)
            return entry.mig if entry is not None else ()

    def _mig_saver(self, uid: str) -> Callable[[tuple[MigRecord, ...]], None]:
        """Saves claim `uid`'s MIG records into its entry (DraError, the entry as it was, when it cannot)."""

        def save(records: tuple[MigRecord, ...]) -> None:
            with self._lock:
                entry = self._checkpoint.get(uid)
                if entry is not None:
                    self._record(uid, replace(entry, mig=records))

        return save

    def _mig_owners(self, uid: str) -> dict[str, str]:
        """MIG UUID -> the label of the claim (not `uid`) that made it."""
        with self._lock:
            return {
                r.mig_uuid: e.ref.label
                for u, e in self._checkpoint
                if u != uid
                for r in e.mig
                if r.state == MADE
            }

    def _unprepare(self, ref: ClaimRef) -> None:
        records = self._mig_of(ref.uid)
        if records:  # destroyed first: while one is in use, the claim keeps its spec and entry for the retry
            if self._dynamic_mig is None:
                raise ClaimError(
                    "it holds MIG devices made for it, and this plugin runs without MIG management"
                )
            self._dynamic_mig.release(ref, records, self._mig_saver(ref.uid), self._mig_owners(ref.uid))
        removed = remove_claim_spec(self._spec_dir, ref.uid)
        if self._sharing is not None:
            self._sharing.release(ref.uid)  # its control daemon, if it has one
        with self._lock:
            entry = self._checkpoint.pop(ref.uid)
            if entry is not None:
                try:
                    self._checkpoint.save()
                except DraError:
                    self._checkpoint.put(ref.uid, entry)
                    raise
        if entry is not None or removed:
            log.info("unprepared %s", ref.label)
        else:
            log.debug("unprepare of %s: not prepared here, nothing to do", ref.label)

    def _record(self, uid: str, entry: Entry) -> None:
        """Put `entry` into the checkpoint and save it; on failure the checkpoint is as it was."""
        with self._lock:  # re-entrant: _record_started holds it
            before = self._checkpoint.get(uid)
            self._checkpoint.put(uid, entry)
            try:
                self._checkpoint.save()
            except DraError:
                if before is None:
                    self._checkpoint.pop(uid)
                else:
                    self._checkpoint.put(uid, before)
                raise


def _devices_named(
    driver: str, results: Sequence[AllocationResult], devices: Mapping[str, DraDevice]
) -> list[DraDevice]:
    """The distinct devices `results` name, in order; ClaimError naming those this node does not have."""
    missing = sorted({r.device for r in results if r.device not in devices})
    if missing:
        have = ", ".join(sorted(devices)) or "none"
        raise ClaimError(
            f"allocated device(s) {', '.join(missing)} of driver {driver} are not on this node "
            f"(it has {have}); was the claim allocated against an older ResourceSlice?"
        )
    return [devices[name] for name in dict.fromkeys(r.device for r in results)]


def _prepared_devices(uid: str, results: Sequence[AllocationResult]) -> tuple[PreparedDevice, ...]:
    """One entry per allocated device (a device shared by several requests lists them all)."""
    requests: dict[tuple[str, str], list[str]] = {}
    for r in results:
        names = requests.setdefault((r.pool, r.device), [])
        if r.request not in names:
            names.append(r.request)
    return tuple(
        PreparedDevice(tuple(names), pool, device, (claim_cdi_id(uid, device),))
        for (pool, device), names in requests.items()
    )
