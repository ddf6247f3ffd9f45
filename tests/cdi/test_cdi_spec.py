"""CDI spec generation and writing, on simulated nodes (their fake driver root), checked against the spec.

CDI_SPEC_SCHEMA is written from the CDI specification's documented fields (SPEC.md: cdiVersion, kind,
devices[].name / containerEdits, containerEdits' env, deviceNodes, mounts, hooks); unknown fields are
refused, as the CDI library refuses them when it loads a spec.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiPlan, CdiSpec
from nvidia_device_plugin.cdi.writer import CdiPublisher, write_specs
from nvidia_device_plugin.cli.main import main
from nvidia_device_plugin.config.v1 import (
    Config,
    DeviceIdStrategy,
    Flags,
    PluginFlags,
    ReplicatedResource,
    ReplicatedResources,
    Sharing,
)
from nvidia_device_plugin.health.registry import UnhealthyIds
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.nvml.sim.host import DRIVER_BINARIES, DRIVER_LIBRARIES
from nvidia_device_plugin.serving.allocate import AllocationIndex, allocate
from nvidia_device_plugin.snapshot import Snapshot, build_snapshot

_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
_PATH = {"type": "string", "pattern": "^/"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
_UINT32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}
_DEVICE_NODE = {
    "type": "object",
    "required": ["path"],
    "additionalProperties": False,
    "properties": {
        "path": _PATH,
        "hostPath": _PATH,
        "type": {"enum": ["b", "c", "u", "p"]},
        "major": {"type": "integer"},
        "minor": {"type": "integer"},
        "fileMode": _UINT32,
        "permissions": {"type": "string", "pattern": "^[rwm]{1,3}$"},
        "uid": _UINT32,
        "gid": _UINT32,
    },
}
_MOUNT = {
    "type": "object",
    "required": ["hostPath", "containerPath"],
    "additionalProperties": False,
    "properties": {
        "hostPath": {"type": "string"},
        "containerPath": _PATH,
        "options": _STRINGS,
        "type": {"type": "string"},
    },
}
_HOOK = {
    "type": "object",
    "required": ["hookName", "path"],
    "additionalProperties": False,
    "properties": {
        "hookName": {
            "enum": [
                "prestart",
                "createRuntime",
                "createContainer",
                "startContainer",
                "poststart",
                "poststop",
            ]
        },
        "path": _PATH,
        "args": _STRINGS,
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "timeout": {"type": "integer", "minimum": 1},
    },
}
_EDITS = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "env": {"type": "array", "items": {"type": "string", "pattern": "^[^=]+="}},
        "deviceNodes": {"type": "array", "items": _DEVICE_NODE},
        "mounts": {"type": "array", "items": _MOUNT},
        "hooks": {"type": "array", "items": _HOOK},
        "additionalGids": {"type": "array", "items": _UINT32},
    },
}
CDI_SPEC_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["cdiVersion", "kind", "devices"],
    "additionalProperties": False,
    "properties": {
        # Versions containerd >= 1.7 and CRI-O >= 1.23 load; hostPath on device nodes needs >= 0.5.0.
        "cdiVersion": {"enum": ["0.5.0", "0.6.0", "0.7.0", "0.8.0"]},
        "kind": {
            "type": "string",
            "pattern": r"^[A-Za-z0-9][A-Za-z0-9.-]*[A-Za-z0-9]/[A-Za-z0-9][A-Za-z0-9_.-]*$",
        },
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
        "devices": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "containerEdits"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": _NAME},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                    # A device without edits is refused by the CDI library.
                    "containerEdits": {**_EDITS, "minProperties": 1},
                },
            },
        },
        "containerEdits": _EDITS,
    },
}


def assert_valid_spec(document: dict[str, Any]) -> None:
    jsonschema.validate(document, CDI_SPEC_SCHEMA)
    names = [d["name"] for d in document["devices"]]
    assert len(names) == len(set(names)), f"device names repeat: {names}"


def cdi_config(
    *strategies: str,
    ids: DeviceIdStrategy = "uuid",
    mig: str = "none",
    replicas: int = 0,
    **plugin: Any,
) -> Config:
    sharing = Sharing()
    if replicas:
        sharing = Sharing(
            time_slicing=ReplicatedResources(resources=(ReplicatedResource("nvidia.com/gpu", replicas),))
        )
    flags_plugin = PluginFlags(
        device_list_strategy=strategies or ("cdi-cri",), device_id_strategy=ids, **plugin
    )  # type: ignore[arg-type]
    return Config(flags=Flags(mig_strategy=mig, plugin=flags_plugin), sharing=sharing)  # type: ignore[arg-type]


@pytest.fixture
def sessions() -> Iterator[list[NvmlSession]]:
    opened: list[NvmlSession] = []
    yield opened
    for session in opened:
        session.close()


def snapshot_of(sessions: list[NvmlSession], node: str, config: Config) -> Snapshot:
    session = open_nvml(node)
    sessions.append(session)
    return build_snapshot(session, config)


def gpu_spec(snapshot: Snapshot) -> CdiSpec:
    assert snapshot.cdi is not None and snapshot.cdi.problem is None, snapshot.cdi
    [spec] = [s for s in snapshot.cdi.specs if s.kind == f"{CDI_VENDOR}/gpu"]
    assert_valid_spec(spec.document)
    return spec


def by_name(spec: CdiSpec) -> dict[str, list[str]]:
    return {
        d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec.document["devices"]
    }


def test_whole_gpus_by_uuid_with_driver_files_control_nodes_and_hooks(sessions: list[NvmlSession]) -> None:
    snapshot = snapshot_of(sessions, "dgx-a100", cdi_config())
    spec = gpu_spec(snapshot)
    gpus = sorted(snapshot.inventory.gpus, key=lambda g: g.index)
    assert by_name(spec) == {
        **{g.uuid: [f"/dev/nvidia{g.minor}"] for g in gpus},
        "all": [f"/dev/nvidia{g.minor}" for g in gpus],
    }
    assert spec.file_name == "k8s.device-plugin.nvidia.com-gpu.json"
    edits = spec.document["containerEdits"]
    assert edits["env"] == ["NVIDIA_VISIBLE_DEVICES=void"]
    # The simulator has no nvidia-modeset: only nodes that exist are named.
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]
    version = snapshot.inventory.driver_version
    mounted = {m["containerPath"] for m in edits["mounts"]}
    libs = {f"/usr/lib/x86_64-linux-gnu/{stem}.so.{version}" for stem in DRIVER_LIBRARIES}
    binaries = {f"/usr/bin/{name}" for name in DRIVER_BINARIES}
    firmware = {
        f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{version}/gsp_tu10x.bin",
    }
    assert mounted == libs | binaries | firmware  # not libc, not the SONAME links
    assert all(
        m["hostPath"] == m["containerPath"] and m["options"] == ["ro", "nosuid", "nodev", "bind"]
        for m in edits["mounts"]
    )
    assert [h["args"] for h in edits["hooks"]] == [
        [
            "nvidia-ctk",
            "hook",
            "create-symlinks",
            "--link",
            "libcuda.so.1::/usr/lib/x86_64-linux-gnu/libcuda.so",
        ],
        ["nvidia-ctk", "hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"],
    ]
    assert {h["path"] for h in edits["hooks"]} == {"/usr/bin/nvidia-ctk"}


def test_mig_devices_by_index_carry_the_same_nodes_as_pass_device_specs(sessions: list[NvmlSession]) -> None:
    snapshot = snapshot_of(sessions, "a100-mig-mixed", cdi_config(ids="index", mig="mixed"))
    spec = by_name(gpu_spec(snapshot))
    assert "3" in spec and "0:0" in spec and "all" in spec
    specs_settings = snapshot.allocation.__class__(
        device_list_strategy=("envvar",),
        pass_device_specs=True,
        proc_root=snapshot.allocation.proc_root,
        device_node_probe_root=snapshot.allocation.device_node_probe_root,
    )
    control = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    healthy = UnhealthyIds(frozenset())
    for plan in snapshot.plans:
        index = AllocationIndex(plan, snapshot.inventory)
        for dev in plan.devices:
            response = allocate(index, [[dev.id]], specs_settings, healthy).container_responses[0]
            passed = [d.container_path for d in response.devices if d.container_path not in control]
            assert spec[dev.index_id] == passed
            if dev.kind == "mig":
                assert len(passed) == 3 and passed[1].startswith("/dev/nvidia-caps/nvidia-cap")


def test_replicas_define_each_physical_device_once(sessions: list[NvmlSession]) -> None:
    snapshot = snapshot_of(sessions, "dgx-a100", cdi_config("cdi-annotations", replicas=4))
    [plan] = snapshot.plans
    assert len(plan.devices) == 32
    assert set(by_name(gpu_spec(snapshot))) == {g.uuid for g in snapshot.inventory.gpus} | {"all"}


def test_host_paths_follow_the_driver_and_dev_roots_and_the_hook_path(sessions: list[NvmlSession]) -> None:
    config = cdi_config(nvidia_ctk_path="/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    config = Config(
        flags=Flags(
            nvidia_driver_root="/run/nvidia/driver", nvidia_dev_root="/host", plugin=config.flags.plugin
        )
    )
    spec = gpu_spec(snapshot_of(sessions, "t4-single", config)).document
    edits = spec["containerEdits"]
    assert {n["hostPath"] for n in edits["deviceNodes"]} == {
        "/host/dev/nvidiactl",
        "/host/dev/nvidia-uvm",
        "/host/dev/nvidia-uvm-tools",
    }
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/host/dev/nvidia0"}
    ]
    assert all(m["hostPath"] == "/run/nvidia/driver" + m["containerPath"] for m in edits["mounts"])
    assert [h["args"][:2] for h in edits["hooks"]] == [
        ["nvidia-cdi-hook", "create-symlinks"],
        ["nvidia-cdi-hook", "update-ldcache"],
    ]


def test_disabled_hooks_and_feature_flags(sessions: list[NvmlSession]) -> None:
    one = gpu_spec(snapshot_of(sessions, "t4-single", cdi_config(cdi_disable_hooks=("update-ldcache",))))
    assert [h["args"][2] for h in one.document["containerEdits"]["hooks"]] == ["create-symlinks"]
    snapshot = snapshot_of(
        sessions,
        "t4-single",
        cdi_config(cdi_disable_hooks=("all", "bogus"), cdi_feature_flags=("frobnicate",)),
    )
    assert "hooks" not in gpu_spec(snapshot).document["containerEdits"]
    assert snapshot.cdi is not None
    assert [n.split(":")[0] for n in snapshot.cdi.notes] == ["cdiDisableHooks", "cdiFeatureFlags"]
    assert "'bogus' ignored" in snapshot.cdi.notes[0] and "'frobnicate'" in snapshot.cdi.notes[1]


def test_no_spec_without_a_cdi_strategy(sessions: list[NvmlSession]) -> None:
    assert snapshot_of(sessions, "t4-single", Config()).cdi is None


def test_a_missing_driver_root_or_library_is_named(sessions: list[NvmlSession]) -> None:
    session = open_nvml("t4-single")
    sessions.append(session)
    assert session.host.driver_root is not None
    lib = session.host.driver_root / "usr/lib/x86_64-linux-gnu"
    assert session.simulator is not None
    version = session.simulator.node.driver_version
    (lib / f"libnvidia-ml.so.{version}").unlink()
    cdi = build_snapshot(session, cdi_config()).cdi
    assert cdi is not None and cdi.specs == ()
    assert (
        cdi.problem is not None
        and f"libnvidia-ml.so.{version} (driver {version}) was not found" in cdi.problem
    )
    shutil.rmtree(session.host.driver_root)
    cdi = build_snapshot(session, cdi_config()).cdi
    assert cdi is not None and cdi.problem is not None
    assert f"the driver root {session.host.driver_root} does not exist" in cdi.problem


def test_gdrcopy_needs_its_device_node_and_gets_its_own_spec(sessions: list[NvmlSession]) -> None:
    session = open_nvml("t4-single")
    sessions.append(session)
    config = Config(flags=Flags(gdrcopy_enabled=True, plugin=cdi_config().flags.plugin))
    cdi = build_snapshot(session, config).cdi
    assert cdi is not None and cdi.problem is not None and "/dev/gdrdrv" in cdi.problem
    (session.host.dev_root / "dev/gdrdrv").touch()
    cdi = build_snapshot(session, config).cdi
    assert cdi is not None and cdi.problem is None
    [extra] = [s for s in cdi.specs if s.kind.endswith("/gdrcopy")]
    assert_valid_spec(extra.document)
    assert extra.device_names == (f"{CDI_VENDOR}/gdrcopy=all",)


def _spec(name: str, devices: list[str]) -> CdiSpec:
    document = {
        "cdiVersion": "0.5.0",
        "kind": f"{CDI_VENDOR}/{name}",
        "devices": [{"name": d, "containerEdits": {"env": ["A=1"]}} for d in devices],
    }
    return CdiSpec(file_name=f"{CDI_VENDOR}-{name}.json", kind=f"{CDI_VENDOR}/{name}", document=document)


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


def _plan_output(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            main(["plan", "--simulate", "t4-single", *argv], environ={"DEVICE_LIST_STRATEGY": "cdi-cri"}) == 0
        )
    return out.getvalue()


def test_plan_shows_the_specs_as_json_as_a_summary_and_alone() -> None:
    document = json.loads(_plan_output("--output", "json"))
    [spec] = document["cdi"]["specs"]
    assert spec["file"] == "k8s.device-plugin.nvidia.com-gpu.json" and document["cdi"]["problem"] is None
    assert spec["devices"] == [f"{CDI_VENDOR}/gpu={d['id']}" for d in document["resources"][0]["devices"]] + [
        f"{CDI_VENDOR}/gpu=all"
    ]
    assert_valid_spec(spec["spec"])
    assert (
        "k8s.device-plugin.nvidia.com-gpu.json: 2 devices, 14 driver files mounted, 2 hooks" in _plan_output()
    )
    alone = json.loads(_plan_output("--cdi-spec"))
    assert alone == {spec["file"]: spec["spec"]}
