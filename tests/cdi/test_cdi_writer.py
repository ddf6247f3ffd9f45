"""Writing the specs: atomic and idempotent, only our stale specs removed, bounded reads of what is there,
and the names kubelet's checkpoint still holds kept defined (issue 23 item 6)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from cdi_support import assert_valid_spec, kubelet_checkpoint

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiError, CdiPlan, CdiSpec
from nvidia_device_plugin.cdi.retention import names_in_use, retain
from nvidia_device_plugin.cdi.writer import CdiPublisher, write_specs

GPU = f"{CDI_VENDOR}/gpu"


def _spec(name: str, devices: list[str], common: dict[str, object] | None = None) -> CdiSpec:
    document: dict[str, object] = {
        "cdiVersion": "0.5.0",
        "kind": f"{CDI_VENDOR}/{name}",
        "devices": [{"name": d, "containerEdits": {"env": [f"DEV={d}"]}} for d in devices],
    }
    if common is not None:
        document["containerEdits"] = common
    return CdiSpec(file_name=f"{CDI_VENDOR}-{name}.json", kind=f"{CDI_VENDOR}/{name}", document=document)


def _names(directory: Path) -> set[str]:
    names = set()
    for file_name in os.listdir(directory):
        document = json.loads((directory / file_name).read_text())
        names |= {f"{document['kind']}={d['name']}" for d in document["devices"]}
    return names


def _cri(*names: str) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=n) for n in names])


def test_writer_is_atomic_idempotent_0644_and_removes_only_our_stale_specs(tmp_path: Path) -> None:
    spec_dir = tmp_path / "cdi"
    spec_dir.mkdir()
    (spec_dir / f"{CDI_VENDOR}-mig.json").write_text("{}")  # ours, from an earlier layout
    (spec_dir / f".{CDI_VENDOR}-gpu.json.x1.tmp").write_text("{")  # a crash mid-write
    (spec_dir / "nvidia.com-gpu.yaml").write_text("x")  # someone else's
    gpu = _spec("gpu", ["0", "1"])
    result = write_specs(spec_dir, [gpu])
    assert result.written == (gpu.file_name,) and result.removed == (f"{CDI_VENDOR}-mig.json",)
    assert sorted(os.listdir(spec_dir)) == [gpu.file_name, "nvidia.com-gpu.yaml"]
    assert json.loads((spec_dir / gpu.file_name).read_text()) == gpu.document
    assert (spec_dir / gpu.file_name).stat().st_mode & 0o777 == 0o644
    inode = (spec_dir / gpu.file_name).stat().st_ino
    assert write_specs(spec_dir, [gpu]).written == ()  # unchanged: not rewritten
    assert (spec_dir / gpu.file_name).stat().st_ino == inode
    write_specs(spec_dir, [_spec("gpu", ["0"])])
    assert (spec_dir / gpu.file_name).stat().st_ino != inode  # replaced by rename, never edited in place
    assert [d["name"] for d in json.loads((spec_dir / gpu.file_name).read_text())["devices"]] == ["0"]


def test_a_spec_path_turned_into_a_fifo_or_a_link_to_dev_zero_is_replaced_without_reading_it(
    tmp_path: Path,
) -> None:
    gpu = _spec("gpu", ["0"])
    for make in (lambda p: os.mkfifo(p), lambda p: p.symlink_to("/dev/zero")):
        spec_dir = tmp_path / f"cdi-{len(os.listdir(tmp_path))}"
        spec_dir.mkdir()
        make(spec_dir / gpu.file_name)
        assert write_specs(spec_dir, [gpu]).written == (gpu.file_name,)  # no hang, no unbounded read
        path = spec_dir / gpu.file_name
        assert not path.is_symlink() and json.loads(path.read_text()) == gpu.document


def test_publisher_removes_its_specs_on_a_problem_and_when_cdi_is_turned_off(tmp_path: Path) -> None:
    publisher = CdiPublisher()
    spec_dir = tmp_path / "cdi"
    gpu = _spec("gpu", ["0"])
    assert publisher.publish(CdiPlan(str(spec_dir), specs=(gpu,))) is None
    assert os.listdir(spec_dir) == [gpu.file_name]
    assert publisher.publish(CdiPlan(str(spec_dir), problem="cannot generate the CDI spec: x")) is not None
    assert os.listdir(spec_dir) == []
    assert publisher.problem == "cannot generate the CDI spec: x"
    publisher.publish(CdiPlan(str(spec_dir), specs=(gpu,)))
    assert publisher.problem is None and os.listdir(spec_dir) == [gpu.file_name]
    publisher.publish(None)
    assert os.listdir(spec_dir) == []


def test_publisher_refuses_when_the_spec_directory_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    problem = CdiPublisher().publish(CdiPlan(str(tmp_path / "file" / "cdi"), specs=(_spec("gpu", ["0"]),)))
    assert problem is not None and "cannot create the CDI spec directory" in problem


def test_the_checkpoint_names_are_read_from_cri_devices_and_annotations(tmp_path: Path) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    assert names_in_use(checkpoint) == frozenset()  # no kubelet wrote one: nothing is in use
    annotated = pb.ContainerAllocateResponse(
        annotations={"cdi.k8s.io/nvidia-device-plugin_x": f"{GPU}=1,{CDI_VENDOR}/gds=all"}
    )
    kubelet_checkpoint(
        checkpoint,
        [
            ("pod-a", "nvidia.com/gpu", ["GPU-a"], _cri(f"{GPU}=GPU-a", "other.vendor/x=1")),
            ("pod-b", "nvidia.com/gpu", ["GPU-b"], annotated),
            ("pod-c", "nvidia.com/gpu", ["GPU-c"], pb.ContainerAllocateResponse(envs={"A": "1"})),
        ],
    )
    assert names_in_use(checkpoint) == {f"{GPU}=GPU-a", f"{GPU}=1", f"{CDI_VENDOR}/gds=all"}
    checkpoint.write_text('{"Data": {"PodDeviceEntries": [{"AllocResp": "not base64!"}]}}')
    with pytest.raises(CdiError, match="not in the format kubelet writes"):
        names_in_use(checkpoint)
    checkpoint.unlink()
    os.mkfifo(checkpoint)
    with pytest.raises(CdiError, match="not a regular file"):
        names_in_use(checkpoint)


def test_retain_keeps_in_use_names_beside_the_current_ones_or_in_their_old_spec() -> None:
    old = _spec("gpu", ["GPU-a", "GPU-b"], common={"env": ["OLD=1"]}).document
    new = _spec("gpu", ["0", "1"], common={"env": ["NEW=1"]})
    merged, kept = retain({new.file_name: old}, [new], frozenset({f"{GPU}=GPU-a"}))
    [spec] = merged
    assert kept == (f"{GPU}=GPU-a",)
    assert [d["name"] for d in spec.document["devices"]] == ["0", "1", "GPU-a"]
    assert spec.document["containerEdits"] == {"env": ["NEW=1"]}  # the node's edits now
    assert_valid_spec(spec.document)
    merged, kept = retain({new.file_name: old}, [], frozenset({f"{GPU}=GPU-b"}))  # no CDI config any more
    assert [(s.file_name, [d["name"] for d in s.document["devices"]]) for s in merged] == [
        (new.file_name, ["GPU-b"])
    ]
    assert merged[0].document["containerEdits"] == {"env": ["OLD=1"]}  # the old spec's libraries etc.
    assert retain({new.file_name: old}, [new], frozenset()) == ((new,), ())
    assert len(retain({new.file_name: old}, [], None)[1]) == 2  # checkpoint unreadable: keep every name


def test_a_name_no_longer_served_stays_defined_until_no_admitted_container_holds_it(tmp_path: Path) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    spec_dir = tmp_path / "cdi"
    publisher = CdiPublisher(checkpoint)
    assert publisher.publish(CdiPlan(str(spec_dir), specs=(_spec("gpu", ["GPU-a", "GPU-b"]),))) is None
    kubelet_checkpoint(checkpoint, [("pod", "nvidia.com/gpu", ["GPU-a"], _cri(f"{GPU}=GPU-a"))])

    assert (
        publisher.publish(CdiPlan(str(spec_dir), specs=(_spec("gpu", ["0", "1"]),))) is None
    )  # uuid -> index
    assert _names(spec_dir) == {f"{GPU}=0", f"{GPU}=1", f"{GPU}=GPU-a"}
    assert publisher.kept == (f"{GPU}=GPU-a",)
    assert publisher.publish(None) is None  # cdi-cri -> envvar: the spec stays, with the held name only
    assert _names(spec_dir) == {f"{GPU}=GPU-a"}

    restarted = CdiPublisher(checkpoint)  # a new process finds the spec of the old one
    assert restarted.publish(CdiPlan(str(spec_dir), specs=(_spec("gpu", ["0"]),))) is None
    assert _names(spec_dir) == {f"{GPU}=0", f"{GPU}=GPU-a"}

    kubelet_checkpoint(checkpoint, [])  # the pod is gone: no container can be given the name again
    assert restarted.publish(CdiPlan(str(spec_dir), specs=(_spec("gpu", ["0"]),))) is None
    assert _names(spec_dir) == {f"{GPU}=0"} and restarted.kept == ()
