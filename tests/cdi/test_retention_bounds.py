"""Kubelet's checkpoint read inside our own bounds (issue 32 item 4): nesting checked before json.loads
recurses, and the documented behaviour (an unreadable checkpoint keeps every name) on every failure."""

from __future__ import annotations

import base64
import json
import tracemalloc
from pathlib import Path

import pytest
from cdi_support import kubelet_checkpoint

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiError, CdiPlan, CdiSpec
from nvidia_device_plugin.cdi.retention import MAX_CHECKPOINT_DEPTH, names_in_use
from nvidia_device_plugin.cdi.writer import CdiPublisher

GPU = f"{CDI_VENDOR}/gpu"


def _spec(devices: list[str]) -> CdiSpec:
    document: dict[str, object] = {
        "cdiVersion": "0.5.0",
        "kind": GPU,
        "devices": [{"name": d, "containerEdits": {"env": [f"DEV={d}"]}} for d in devices],
    }
    return CdiSpec(file_name=f"{CDI_VENDOR}-gpu.json", kind=GPU, document=document)


def _names(spec_dir: Path) -> set[str]:
    names: set[str] = set()
    for path in spec_dir.iterdir():
        document = json.loads(path.read_text())
        names |= {f"{document['kind']}={d['name']}" for d in document["devices"]}
    return names


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_a_checkpoint_nested_200000_deep_is_refused_as_unreadable_not_a_recursion_error(
    tmp_path: Path, opener: str
) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    closer = "]" if opener == "[" else "}"
    checkpoint.write_text(opener * 200_000 + "1" + closer * 200_000)  # 0.4-1.2 MB
    with pytest.raises(CdiError, match=f"nests deeper than {MAX_CHECKPOINT_DEPTH} levels"):
        names_in_use(checkpoint)
    checkpoint.write_text("[" * 200_000 + "}" * 200_000)  # deep and mismatched: refused before recursing
    with pytest.raises(CdiError, match="brackets do not pair up"):
        names_in_use(checkpoint)


def test_brackets_and_quotes_inside_strings_do_not_count_as_nesting(tmp_path: Path) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    response = pb.ContainerAllocateResponse(cdi_devices=[pb.CDIDevice(name=f"{GPU}=GPU-a")])
    entry = {
        "PodUID": 'pod-[[[[{{{{"\\',
        "ContainerName": "]]]]" * 40_000,  # 160 KB of brackets in one string, across the check's slices
        "ResourceName": "nvidia.com/gpu",
        "DeviceIDs": {"-1": ["GPU-a"]},
        "AllocResp": base64.b64encode(response.SerializeToString()).decode(),
    }
    document = {"Data": {"PodDeviceEntries": [entry], "RegisteredDevices": {}}, "Checksum": 0}
    checkpoint.write_text(json.dumps(document))
    assert names_in_use(checkpoint) == {f"{GPU}=GPU-a"}


def test_a_deep_checkpoint_keeps_every_name_and_the_reload_goes_on(tmp_path: Path) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    spec_dir = tmp_path / "cdi"
    publisher = CdiPublisher(checkpoint)
    assert publisher.publish(CdiPlan(str(spec_dir), specs=(_spec(["GPU-a", "GPU-b"]),))) is None
    checkpoint.write_text("[" * 200_000 + "]" * 200_000)
    assert publisher.publish(CdiPlan(str(spec_dir), specs=(_spec(["0"]),))) is None  # applied
    assert _names(spec_dir) == {f"{GPU}=0", f"{GPU}=GPU-a", f"{GPU}=GPU-b"}  # every old name kept


def test_parsing_holds_about_twice_the_file_not_the_whole_json_tree(tmp_path: Path) -> None:
    """500 containers with 64 device IDs each (about 3.6 MiB): what the parse allocates at its peak (the
    file's bytes and text, then the names found) stays under 2.5x the file; json.loads' whole tree, with a
    Python string per device ID, was 4x."""
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    admitted = []
    for n in range(500):
        ids = [f"GPU-{n:08d}-aaaa-bbbb-cccc-dddddddddddd::{k}" for k in range(64)]
        response = pb.ContainerAllocateResponse(
            envs={"NVIDIA_VISIBLE_DEVICES": ",".join(ids[:8])},
            cdi_devices=[pb.CDIDevice(name=f"{GPU}={i}") for i in ids[:8]],
        )
        admitted.append((f"pod-{n}", "nvidia.com/gpu", ids, response))
    kubelet_checkpoint(checkpoint, admitted)
    size = checkpoint.stat().st_size
    tracemalloc.start()
    try:
        names = names_in_use(checkpoint)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(names) == 4000
    assert peak < 2.5 * size, f"peak {peak / size:.1f}x the {size:,}-byte checkpoint"


@pytest.mark.parametrize(
    "text", ["[]", '{"Data": {"RegisteredDevices": {}}}', '{"Data": {"PodDeviceEntries": [1]}}', '"x"']
)
def test_a_checkpoint_without_kubelets_layout_is_refused_naming_what_is_missing(
    tmp_path: Path, text: str
) -> None:
    checkpoint = tmp_path / "kubelet_internal_checkpoint"
    checkpoint.write_text(text)
    with pytest.raises(
        CdiError, match=r"not in the format kubelet writes: .*(Data\.PodDeviceEntries|pod-device)"
    ):
        names_in_use(checkpoint)
