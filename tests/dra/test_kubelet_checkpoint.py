"""Prepared claims across restarts: the checkpoint keeps them through a new plugin object and a killed
daemon process, a reboot (another boot ID) forgets them and their specs, a half-done prepare is finished,
and a checkpoint that cannot be used is set aside with a clear error instead of stopping the plugin."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.dra.kubelet.cdispec import claim_spec_file
from nvidia_device_plugin.dra.kubelet.checkpoint import STARTED, Checkpoint, Entry
from nvidia_device_plugin.dra.kubelet.model import ClaimRef, DraError, PreparedSharing

from support.dra_kubelet import DraKubeletStandIn, DraNode, dra_node, resource_claim

UID = "0f3c6b1e-1111-4a5e-9d7e-000000000001"
CLAIM = ("default", "gpu-claim", UID)
TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture
def dra() -> Iterator[DraNode]:
    yield from dra_node()


def prepare_once(dra: DraNode, claim: tuple[str, str, str] = CLAIM) -> list[str]:
    """Prepare `claim` on a fresh plugin object and stop it again; the CDI IDs returned."""
    plugin = dra.plugin()
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        answer = kubelet.prepare([claim])[claim[2]]
    plugin.stop()
    assert answer.error == ""
    return [i for d in answer.devices for i in d.cdi_device_ids]


def test_a_new_plugin_object_on_the_same_checkpoint_keeps_the_prepared_claims(dra: DraNode) -> None:
    dra.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-5")]))
    ids = prepare_once(dra)
    dra.api.claims.delete("default", "gpu-claim")  # answered without the API from now on
    plugin = dra.plugin()
    assert plugin.prepared() == {UID: ("gpu-5",)}
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        again = kubelet.prepare([CLAIM])[UID]
        assert again.error == "" and [i for d in again.devices for i in d.cdi_device_ids] == ids
        assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert dra.api.claims.reads == [("default", "gpu-claim")]
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()
    assert json.loads(dra.checkpoint.read_text())["claims"] == {}


def test_a_reboot_forgets_the_checkpoint_and_removes_its_specs(
    dra: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin.dra.kubelet")
    dra.api.claims.put(resource_claim(UID))
    prepare_once(dra)
    assert (dra.spec_dir / claim_spec_file(UID)).exists()
    dra.boot_id.write_text("6f1e1c3a-0000-4000-8000-000000000002\n")
    plugin = dra.plugin()
    assert plugin.prepared() == {}
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()
    assert "written before the node rebooted (boot ID 6f1e1c3a-0000-4000-8000-000000000001" in caplog.text
    saved = json.loads(dra.checkpoint.read_text())
    assert saved["bootID"] == "6f1e1c3a-0000-4000-8000-000000000002" and saved["claims"] == {}
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        assert kubelet.prepare([CLAIM])[UID].error == ""  # prepared anew, from the API
    assert len(dra.api.claims.reads) == 2


def test_a_prepare_interrupted_after_it_started_is_finished_by_the_next_call(dra: DraNode) -> None:
    dra.api.claims.put(resource_claim(UID))
    dra.boot_id.write_text("6f1e1c3a-0000-4000-8000-000000000001\n")
    started = Checkpoint(dra.checkpoint, "6f1e1c3a-0000-4000-8000-000000000001")
    started.put(UID, Entry(ClaimRef(*CLAIM), STARTED))
    started.save()
    plugin = dra.plugin()
    assert plugin.prepared() == {UID: ()}
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        assert kubelet.prepare([CLAIM])[UID].error == ""
    assert json.loads(dra.checkpoint.read_text())["claims"][UID]["state"] == "PrepareCompleted"
    assert dra.spec(UID)["devices"][0]["name"] == f"{UID}-gpu-0"


def test_a_completed_claim_whose_spec_vanished_is_prepared_again(dra: DraNode) -> None:
    dra.api.claims.put(resource_claim(UID))
    prepare_once(dra)
    (dra.spec_dir / claim_spec_file(UID)).unlink()
    prepare_once(dra)
    assert dra.spec(UID)["devices"][0]["name"] == f"{UID}-gpu-0"
    assert len(dra.api.claims.reads) == 2


def test_a_corrupt_checkpoint_is_set_aside_and_the_plugin_serves(
    dra: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    dra.checkpoint.parent.mkdir(parents=True)
    dra.checkpoint.write_text('{"version": 1, "bootID": "x", "claims": {"u": {"state": "Prepared"}}}')
    dra.api.claims.put(resource_claim(UID))
    assert prepare_once(dra) == [f"k8s.gpu.nvidia.com/claim={UID}-gpu-0"]
    assert (
        f"DRA checkpoint {dra.checkpoint} cannot be used (claim 'u': unknown state 'Prepared')" in caplog.text
    )
    assert dra.checkpoint.with_name("checkpoint.json.corrupt").exists()


def test_a_fifo_in_place_of_the_checkpoint_is_never_read(
    dra: DraNode, caplog: pytest.LogCaptureFixture
) -> None:
    dra.checkpoint.parent.mkdir(parents=True)
    os.mkfifo(dra.checkpoint)
    plugin = dra.plugin()  # would block forever in a plain read
    assert plugin.prepared() == {}
    assert f"{dra.checkpoint}: is a named pipe (FIFO), not a regular file" in caplog.text


def test_a_checkpoint_over_the_limit_is_refused(
    dra: DraNode, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("nvidia_device_plugin.dra.kubelet.checkpoint.MAX_CHECKPOINT_BYTES", 1024)
    dra.checkpoint.parent.mkdir(parents=True)
    dra.checkpoint.write_text(" " * 1025)
    dra.plugin()
    assert f"{dra.checkpoint}: is larger than 1 KiB" in caplog.text


def test_a_checkpoint_that_cannot_be_written_fails_the_claim_and_says_where(dra: DraNode) -> None:
    dra.api.claims.put(resource_claim(UID))
    blocker = dra.root / "not-a-directory"
    blocker.write_text("")
    dra.plugin(checkpoint_path=blocker / "checkpoint.json")
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        error = kubelet.prepare([CLAIM])[UID].error
    assert f"cannot write the DRA checkpoint {blocker / 'checkpoint.json'}" in error
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()
    assert dra.started[0].prepared() == {}


def test_an_unreadable_boot_id_fails_the_start_by_name(dra: DraNode) -> None:
    missing = dra.root / "no-boot-id"
    with pytest.raises(DraError, match=f"cannot read the boot ID from {missing}"):
        dra.plugin(boot_id_path=missing)
    assert not dra.started[-1].alive


def serve(dra: DraNode) -> subprocess.Popen[str]:
    """A DraKubeletPlugin in a process of its own, on `dra`'s directories; waits until it serves."""
    paths = {
        "plugins_dir": dra.plugins_dir,
        "registry_dir": dra.registry_dir,
        "cdi_spec_dir": dra.spec_dir,
        "checkpoint_path": dra.checkpoint,
        "boot_id_path": dra.boot_id,
    }
    args = {"paths": {k: str(v) for k, v in paths.items()}, "api_url": dra.api.url, "preset": "dgx-a100"}
    code = (
        f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
        "from support.dra_kubelet import serve_main; serve_main(sys.argv[1:])"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps(args)], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "serving\n"
    return process


def test_claims_survive_a_killed_daemon_process(dra: DraNode) -> None:
    dra.boot_id.write_text("6f1e1c3a-0000-4000-8000-000000000001\n")
    dra.api.claims.put(resource_claim(UID, results=[("gpu", "gpu-1"), ("gpu", "gpu-2")]))
    with DraKubeletStandIn(dra.registry_dir) as kubelet:
        first = serve(dra)
        try:
            ids = [list(d.cdi_device_ids) for d in kubelet.prepare([CLAIM])[UID].devices]
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        dra.api.claims.delete("default", "gpu-claim")
        second = serve(dra)  # the killed process left its sockets behind: the new one replaces them
        try:
            kubelet.current(dra.registry_dir / "gpu.nvidia.com-reg.sock")
            again = kubelet.prepare([CLAIM])[UID]
            assert again.error == "" and [list(d.cdi_device_ids) for d in again.devices] == ids
            assert kubelet.unprepare([CLAIM])[UID].error == ""
        finally:
            second.send_signal(signal.SIGTERM)
            assert second.wait(30) == 0
    assert dra.api.claims.reads == [("default", "gpu-claim")]
    assert not (dra.spec_dir / claim_spec_file(UID)).exists()


def test_what_a_claims_opaque_config_set_up_is_kept_and_a_checkpoint_from_before_it_still_loads(
    tmp_path: Path,
) -> None:
    path = tmp_path / "checkpoint.json"
    sharing = (
        PreparedSharing("GPU-a", "time-slicing", "Long"),
        PreparedSharing("GPU-b", "mps", None, 50, 10240),
    )
    Checkpoint(path, "boot", {UID: Entry(ClaimRef("default", "c", UID), STARTED, (), sharing)}).save()
    loaded, _ = Checkpoint.load(path, "boot")
    entry = loaded.get(UID)
    assert entry is not None and entry.sharing == sharing
    document = json.loads(path.read_text())
    del document["claims"][UID]["sharing"]  # as written before opaque config was read
    path.write_text(json.dumps(document))
    loaded, _ = Checkpoint.load(path, "boot")
    entry = loaded.get(UID)
    assert entry is not None and entry.sharing == ()


def test_a_checkpoint_naming_an_unknown_sharing_mode_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    shared = (PreparedSharing("GPU-a", "time-slicing", "Long"),)
    Checkpoint(path, "boot", {UID: Entry(ClaimRef("default", "c", UID), STARTED, (), shared)}).save()
    path.write_text(path.read_text().replace('"time-slicing"', '"spatial"'))
    loaded, _ = Checkpoint.load(path, "boot")
    assert loaded.get(UID) is None and path.with_name("checkpoint.json.corrupt").exists()
