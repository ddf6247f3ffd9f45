"""The claims the node's disk still shows (per-claim CDI specs, a set-aside checkpoint): what holds a GPU
on the DRA side when pod-resources and the kubelet plugin's memory do not, read within bounds."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from nvidia_device_plugin.dra import claims_on_disk as module
from nvidia_device_plugin.dra.claims_on_disk import ClaimsOnDisk, claims_on_disk, gpus_of_devices
from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file

UID_A = "0f3c6b1e-0000-4a5e-9d7e-00000000000a"
UID_B = "0f3c6b1e-0000-4a5e-9d7e-00000000000b"


def _spec(spec_dir: Path, uid: str, devices: list[str]) -> Path:
    spec_dir.mkdir(exist_ok=True)
    path = spec_dir / claim_spec_file(uid)
    names = [{"name": f"{uid}-{d}", "containerEdits": {}} for d in devices]
    path.write_text(json.dumps({"cdiVersion": "0.5.0", "kind": "k8s.gpu.nvidia.com/claim", "devices": names}))
    return path


def test_no_spec_directory_is_no_claim(tmp_path: Path) -> None:
    assert claims_on_disk(tmp_path / "cdi", tmp_path / "checkpoint.json") == ClaimsOnDisk(frozenset())


def test_each_claim_spec_names_its_devices_and_other_specs_are_not_read(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    _spec(spec_dir, UID_A, ["gpu-1"])
    _spec(spec_dir, UID_B, ["gpu-2-mig-1g10gb-19-0", "gpu-3"])
    (spec_dir / "nvidia.com-gpu.json").write_text("not ours, not read")
    found = claims_on_disk(spec_dir, tmp_path / "checkpoint.json")
    assert found == ClaimsOnDisk(frozenset({"gpu-1", "gpu-2-mig-1g10gb-19-0", "gpu-3"}))


@pytest.mark.parametrize(
    "content",
    ["{not json", '["a list"]', '{"devices": {}}', '{"devices": [{"name": "someone-else-gpu-1"}]}'],
)
def test_a_spec_that_cannot_be_understood_makes_the_claims_unknown(tmp_path: Path, content: str) -> None:
    path = _spec(tmp_path / "cdi", UID_A, [])
    path.write_text(content)
    found = claims_on_disk(tmp_path / "cdi", tmp_path / "checkpoint.json")
    assert found.unknown is not None and str(path) in found.unknown


def test_a_fifo_in_a_spec_s_place_is_refused_without_blocking(tmp_path: Path) -> None:
    (tmp_path / "cdi").mkdir()
    os.mkfifo(tmp_path / "cdi" / claim_spec_file(UID_A))
    found = claims_on_disk(tmp_path / "cdi", tmp_path / "checkpoint.json")
    assert found.unknown is not None and "named pipe" in found.unknown


def test_specs_over_the_bounds_make_the_claims_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec_dir = tmp_path / "cdi"
    for uid in (UID_A, UID_B):
        _spec(spec_dir, uid, ["gpu-1"])
    monkeypatch.setattr(module, "MAX_CLAIM_SPECS", 1)
    assert "more than 1" in str(claims_on_disk(spec_dir, tmp_path / "checkpoint.json").unknown)
    monkeypatch.setattr(module, "MAX_CLAIM_SPECS", 2)
    monkeypatch.setattr(module, "MAX_SPEC_DIR_ENTRIES", 1)
    assert "more than 1 entries" in str(claims_on_disk(spec_dir, tmp_path / "checkpoint.json").unknown)
    monkeypatch.setattr(module, "MAX_SPEC_DIR_ENTRIES", 10)
    monkeypatch.setattr(module, "MAX_CLAIM_SPEC_BYTES", 16)
    assert "16" in str(claims_on_disk(spec_dir, tmp_path / "checkpoint.json").unknown)


def test_a_set_aside_checkpoint_makes_the_claims_unknown_until_it_is_removed(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint.json"
    aside = tmp_path / "checkpoint.json.corrupt"
    aside.write_text("{")
    found = claims_on_disk(tmp_path / "cdi", checkpoint)
    assert (
        found.unknown is not None and f"set aside as {aside}" in found.unknown and "remove" in found.unknown
    )
    aside.unlink()
    assert claims_on_disk(tmp_path / "cdi", checkpoint).unknown is None


def test_a_claimed_device_holds_its_gpu_even_once_it_is_no_longer_published() -> None:
    from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice

    mig = MigDevice("MIG-a", 0, "GPU-1", 0, "1g.10gb", 10 << 30, gpu_instance_id=1, compute_instance_id=0)
    inventory = Inventory(
        (
            Gpu(0, "GPU-0", "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:07:00.0", 0, None, False, ()),
            Gpu(1, "GPU-1", "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:0F:00.0", 1, None, True, (mig,)),
            Gpu(2, "GPU-2", "NVIDIA A100-SXM4-80GB", 80 << 30, "00000000:47:00.0", 2, None, False, ()),
        )
    )
    claimed = {"gpu-0", "gpu-1-mig-2g20gb-14-0", "gpu-9", "gpu-x", "nic-2"}  # a MIG layout since changed
    assert gpus_of_devices(claimed, inventory) == {"GPU-0", "GPU-1"}
