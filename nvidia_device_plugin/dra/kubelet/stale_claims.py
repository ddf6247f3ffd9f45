"""At start, the MIG devices made for claims kubelet can no longer have are destroyed.

Kubelet unprepares a claim whose pod is gone, but not one deleted while this plugin was down on a node
kubelet then forgot it on (its own checkpoint lost, the pod force-deleted): such a claim's MIG device would
hold its memory slices for ever. So, after the checkpoint is read and its MIG records adopted, a thread
asks the API for each checkpointed claim that holds MIG devices made for it, as NVIDIA's DRA driver's
checkpoint cleanup does (kubernetes-sigs/dra-driver-nvidia-gpu, `unprepareIfStale`):

* no claim of that namespace and name (404), or one with another UID (deleted and made anew), or one
  whose allocation no longer names every device the checkpoint prepared for it in this driver's pool:
  kubelet cannot have it. The claim is unprepared here, by the same path kubelet's Unprepare takes (its
  MIG devices destroyed, its CDI spec and checkpoint entry removed), and one line names it and its
  MIG devices;
* a claim that exists as prepared keeps its MIG devices;
* an API error or timeout (each read bounded as every claim read is, dra/kubelet/claims.py) keeps
  everything, and the claim is asked for again after RETRY_FIRST_S, doubling to RETRY_MAX_S, until the
  API answers or the plugin stops. So does a destroy that fails (NVML's reason is logged).

The thread runs once per start and ends when every such claim is settled; start-up does not wait for it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.dra.kubelet.checkpoint import Entry
from nvidia_device_plugin.dra.kubelet.claims import ClaimNotFound, ClaimSource
from nvidia_device_plugin.dra.kubelet.model import DraError

log = logging.getLogger(__name__)

RETRY_FIRST_S = 1.0
RETRY_MAX_S = 300.0  # an API that stays down is asked every 5 minutes


class MadeMigClaims(Protocol):
    """What the sweep asks of the claim preparer (prepare.ClaimPreparer)."""

    def made_mig_entries(self) -> list[Entry]:
        """The checkpoint entries of claims that hold MIG devices made for them."""
        ...

    def unprepare_lost(self, entry: Entry, why: str) -> bool:
        """Unprepare `entry`'s claim as kubelet would, since kubelet can no longer have it (`why`); False
        when the checkpoint's entry is no longer `entry`; DraError when a MIG device cannot be destroyed."""
        ...


def lost_reason(entry: Entry, claim: dict[str, Any] | None, driver: str) -> str | None:
    """Why kubelet can no longer have `entry`'s claim, given the API's `claim` (None: there is none), or
    None when the claim is still the one prepared here."""
    if claim is None:
        return "the API has no such claim (deleted)"
    metadata = claim.get("metadata")
    uid = metadata.get("uid") if isinstance(metadata, dict) else None
    if uid != entry.ref.uid:
        return f"the API's claim of that name has UID {uid or '(none)'} (deleted and made anew)"
    missing = sorted(f"{pool}/{device}" for pool, device in _prepared(entry) - _allocated(claim, driver))
    if missing:
        return f"its allocation no longer names {', '.join(missing)} of driver {driver}"
    return None


def _prepared(entry: Entry) -> set[tuple[str, str]]:
    return {(d.pool, d.device) for d in entry.devices}


def _allocated(claim: dict[str, Any], driver: str) -> set[tuple[str, str]]:
    """(pool, device) of each of `driver`'s results in `claim`'s allocation; empty when not allocated."""
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, dict) else None
    devices = allocation.get("devices") if isinstance(allocation, dict) else None
    results = devices.get("results") if isinstance(devices, dict) else None
    named: set[tuple[str, str]] = set()
    for result in results if isinstance(results, list) else []:
        if isinstance(result, dict) and result.get("driver") == driver:
            named.add((str(result.get("pool")), str(result.get("device"))))
    return named


class StaleMigClaims:
    """One sweep over `preparer`'s claims that hold made MIG devices, asking `claims` (the API) for each;
    `run(stop)` returns once each is settled, or when `stop` is set."""

    def __init__(
        self,
        claims: ClaimSource,
        driver: str,
        preparer: MadeMigClaims,
        retry_s: tuple[float, float] = (RETRY_FIRST_S, RETRY_MAX_S),
    ) -> None:
        self._claims = claims
        self._driver = driver
        self._preparer = preparer
        self._retry_first_s, self._retry_max_s = retry_s
        self._failures = FailureLog(log)

    def run(self, stop: threading.Event) -> None:
        pending = {entry.ref.uid for entry in self._preparer.made_mig_entries()}
        delay = self._retry_first_s
        while pending and not stop.is_set():
            # Read afresh each round: kubelet may have unprepared a claim, or a destroy dropped a record.
            entries = [e for e in self._preparer.made_mig_entries() if e.ref.uid in pending]
            pending = {entry.ref.uid for entry in entries if not self._guarded(entry)}
            if pending and stop.wait(delay):
                return
            delay = min(delay * 2, self._retry_max_s)

    def _guarded(self, entry: Entry) -> bool:
        """`_settle(entry)`; a surprise (a bug) is said once and the claim asked for again later."""
        try:
            return self._settle(entry)
        except Exception as exc:  # this thread must not end with claims unsettled
            message = f"settling {entry.ref.label} failed unexpectedly, will retry: {exc!r}"
            self._failures.report(entry.ref.uid, message, exc_info=True)
            return False

    def _settle(self, entry: Entry) -> bool:
        """Whether `entry`'s claim is settled: kept, or unprepared. False (said once per reason) when the
        API could not be asked or a MIG device could not be destroyed: asked again later."""
        ref = entry.ref
        key = ref.uid
        try:
            claim: dict[str, Any] | None = self._claims.get(ref.namespace, ref.name)
        except ClaimNotFound:
            claim = None
        except DraError as exc:
            self._failures.report(key, f"cannot tell if kubelet still has {ref.label}, will retry: {exc}")
            return False
        why = lost_reason(entry, claim, self._driver)
        if why is None:
            self._failures.clear(key)
            log.debug("%s still exists as prepared: its MIG devices stay", ref.label)
            return True
        try:
            done = self._preparer.unprepare_lost(entry, why)
        except DraError as exc:
            self._failures.report(key, f"unpreparing {ref.label} ({why}) failed, will retry: {exc}")
            return False
        self._failures.clear(key)
        return done  # else kubelet changed the claim's entry since: the API is asked again
