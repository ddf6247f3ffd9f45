"""The stale-claim sweep's rule and loop (dra/kubelet/stale_claims.py) with a stand-in claim source and
preparer: which API answers mean kubelet can no longer have a claim, and what is asked again."""

from __future__ import annotations

import threading
from typing import Any

from nvidia_device_plugin.dra.kubelet.checkpoint import Entry, MigRecord
from nvidia_device_plugin.dra.kubelet.claims import ClaimNotFound
from nvidia_device_plugin.dra.kubelet.model import ClaimError, ClaimRef, PreparedDevice
from nvidia_device_plugin.dra.kubelet.stale_claims import StaleMigClaims, lost_reason
from nvidia_device_plugin.dra.names import DRIVER_NAME

from support.dra_kubelet import NODE, resource_claim

DEVICE = "gpu-0-mig-1g10gb-19-6"
REF = ClaimRef("default", "claim-1", "uid-1")
RECORD = MigRecord(DEVICE, "GPU-a", 0, "1g.10gb", 19, 6, 1, "made", 3, 0, "MIG-b")
ENTRY = Entry(REF, "PrepareCompleted", (PreparedDevice(("mig",), NODE, DEVICE, ()),), (), (RECORD,))


def test_the_claims_kubelet_can_no_longer_have() -> None:
    claim = resource_claim("uid-1", name="claim-1", results=[("mig", DEVICE)])
    assert lost_reason(ENTRY, claim, DRIVER_NAME) is None
    assert "deleted" in (lost_reason(ENTRY, None, DRIVER_NAME) or "")
    other = resource_claim("uid-2", name="claim-1", results=[("mig", DEVICE)])
    assert "UID uid-2" in (lost_reason(ENTRY, other, DRIVER_NAME) or "")
    unallocated = resource_claim("uid-1", name="claim-1", allocated=False)
    assert f"{NODE}/{DEVICE}" in (lost_reason(ENTRY, unallocated, DRIVER_NAME) or "")
    elsewhere = resource_claim("uid-1", name="claim-1", results=[("mig", "gpu-0-mig-1g10gb-19-5")])
    assert lost_reason(ENTRY, elsewhere, DRIVER_NAME) is not None
    another_driver = resource_claim("uid-1", name="claim-1", results=[("mig", DEVICE)], driver="x.example")
    assert lost_reason(ENTRY, another_driver, DRIVER_NAME) is not None
    assert lost_reason(ENTRY, {"metadata": "?", "status": []}, DRIVER_NAME) is not None  # malformed: not it


class Answers:
    """A claim source answering from a list, one answer per read (an exception is raised)."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.reads = 0

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        self.reads += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        assert isinstance(answer, dict)
        return answer


class Preparer:
    """The preparer's two calls; `changed` times the entry is found changed by kubelet first."""

    def __init__(self, changed: int = 0) -> None:
        self.entries = [ENTRY]
        self.unprepared: list[str] = []
        self.changed = changed

    def made_mig_entries(self) -> list[Entry]:
        return list(self.entries)

    def unprepare_lost(self, entry: Entry, why: str) -> bool:
        if self.changed:
            self.changed -= 1
            return False
        self.unprepared.append(why)
        self.entries.remove(entry)
        return True


def sweep(source: Answers, preparer: Preparer) -> None:
    StaleMigClaims(source, DRIVER_NAME, preparer, (0.001, 0.004)).run(threading.Event())


def test_api_errors_and_surprises_are_asked_again_until_the_api_answers() -> None:
    preparer = Preparer()
    failures = (ClaimError("HTTP 500"), RuntimeError("a bug"), ClaimError("timed out"))
    source = Answers(*failures, ClaimNotFound("404"))
    sweep(source, preparer)
    assert source.reads == 4 and len(preparer.unprepared) == 1 and "deleted" in preparer.unprepared[0]


def test_an_entry_kubelet_changed_meanwhile_is_asked_for_again() -> None:
    preparer = Preparer(changed=1)
    source = Answers(ClaimNotFound("404"))
    sweep(source, preparer)
    assert source.reads == 2 and len(preparer.unprepared) == 1


def test_a_claim_that_exists_is_asked_once_and_kept() -> None:
    preparer = Preparer()
    source = Answers(resource_claim("uid-1", name="claim-1", results=[("mig", DEVICE)]))
    sweep(source, preparer)
    assert source.reads == 1 and preparer.unprepared == [] and preparer.entries == [ENTRY]


def test_a_stopped_sweep_returns_without_asking() -> None:
    stop = threading.Event()
    stop.set()
    source = Answers(ClaimNotFound("404"))
    StaleMigClaims(source, DRIVER_NAME, Preparer()).run(stop)
    assert source.reads == 0
