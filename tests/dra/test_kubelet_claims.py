"""What a prepare reads from a ResourceClaim (pure: claims.allocated_results), the checkpoint's format, and
the CDI names of a prepared claim."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nvidia_device_plugin.dra.kubelet.cdispec import claim_cdi_id, claim_spec_file
from nvidia_device_plugin.dra.kubelet.checkpoint import COMPLETED, Checkpoint, Entry, read_boot_id
from nvidia_device_plugin.dra.kubelet.claims import AllocationResult, allocated_results
from nvidia_device_plugin.dra.kubelet.model import ClaimError, ClaimRef, DraError, PreparedDevice
from nvidia_device_plugin.dra.names import DRIVER_NAME

from support.dra_kubelet import NODE, resource_claim

UID = "0f3c6b1e-1111-4a5e-9d7e-000000000001"
REF = ClaimRef("default", "gpu-claim", UID)


def results_of(claim: dict[str, Any]) -> tuple[AllocationResult, ...]:
    return allocated_results(REF, claim, DRIVER_NAME)


def test_results_of_this_driver_with_subrequests_stripped() -> None:
    claim = resource_claim(UID, results=[("gpus/a100", "gpu-0"), ("single", "gpu-1")])
    claim["status"]["allocation"]["devices"]["results"].insert(
        0, {"request": "nic", "driver": "nic.example.com", "pool": "p", "device": "eth0"}
    )
    assert results_of(claim) == (
        AllocationResult("gpus", NODE, "gpu-0", "gpus/a100"),
        AllocationResult("single", NODE, "gpu-1", "single"),
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda c: c["metadata"].update(uid="other"), "has UID other: it was replaced"),
        (lambda c: c["metadata"].pop("uid"), "has UID (none): it was replaced"),
        (lambda c: c["status"].pop("allocation"), "is not allocated (status.allocation is empty)"),
        (lambda c: c.pop("status"), "is not allocated"),
        (
            lambda c: c["status"]["allocation"].update(devices=["gpu-0"]),
            "status.allocation.devices is not an object",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"].update(results={"a": 1}),
            "status.allocation.devices.results is not a list",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"].append("gpu-1"),
            "status.allocation.devices.results[1] is not an object",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"]["results"][0].pop("device"),
            "status.allocation.devices.results[0] lacks request, pool or device",
        ),
        (
            lambda c: c["status"]["allocation"]["devices"].update(
                config=[{"opaque": {"driver": DRIVER_NAME}}]
            ),
            "config[0] (None): source must be FromClass or FromClaim",
        ),
    ],
)
def test_claims_refused_and_why(change: Any, message: str) -> None:
    claim = resource_claim(UID)
    change(claim)
    with pytest.raises(ClaimError) as raised:
        results_of(claim)
    assert str(raised.value).startswith(f"claim default/gpu-claim (UID {UID})")
    assert message in str(raised.value)


def test_cdi_names_and_file_as_nvidias_driver_names_them() -> None:
    assert claim_cdi_id(UID, "gpu-3") == f"k8s.gpu.nvidia.com/claim={UID}-gpu-3"
    assert claim_spec_file(UID) == f"k8s.gpu.nvidia.com-claim_{UID}.json"


def test_the_checkpoint_round_trips_and_is_private(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    entry = Entry(REF, COMPLETED, (PreparedDevice(("a", "b"), NODE, "gpu-0", (claim_cdi_id(UID, "gpu-0"),)),))
    written = Checkpoint(path, "boot-1")
    written.put(UID, entry)
    written.save()
    assert path.stat().st_mode & 0o777 == 0o600
    loaded, dropped = Checkpoint.load(path, "boot-1")
    assert dropped == () and loaded.get(UID) == entry
    rebooted, dropped = Checkpoint.load(path, "boot-2")
    assert dropped == (entry,) and list(rebooted) == []


def test_the_boot_id_is_read_and_an_empty_one_refused(tmp_path: Path) -> None:
    (tmp_path / "boot_id").write_text("6f1e1c3a-0000-4000-8000-000000000001\n")
    assert read_boot_id(tmp_path / "boot_id") == "6f1e1c3a-0000-4000-8000-000000000001"
    (tmp_path / "boot_id").write_text("\n")
    with pytest.raises(DraError, match="is empty"):
        read_boot_id(tmp_path / "boot_id")


def test_this_hosts_boot_id_is_readable() -> None:
    assert len(read_boot_id()) == 36  # a UUID, on every Linux
