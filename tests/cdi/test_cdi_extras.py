"""IMEX channels and the extra modes (gdrcopy, gds, mofed): their specs, and the names Allocate gives.

NVIDIA's facts: v0.20 (k8s-device-plugin internal/plugin/server.go, internal/cdi/imex.go, internal/imex)
names `k8s.device-plugin.nvidia.com/imex-channel=<id>` after the GPUs under the CDI strategies and writes
an imex-channel spec; under envvar it sets NVIDIA_IMEX_CHANNELS, under volume-mounts it mounts /dev/null at
/var/run/nvidia-container-devices/imex/<id>, with passDeviceSpecs it passes the channel's device spec.
An extra mode whose kernel nodes are absent gets an empty spec, which NVIDIA drops (`Ignoring empty CDI
specs`), so Allocate does not name it, and the GPUs are served (internal/cdi/cdi.go CreateSpecFile).
"""

from __future__ import annotations

from collections.abc import Sequence

from cdi_support import assert_valid_spec

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cdi.model import CDI_VENDOR
from nvidia_device_plugin.config.v1 import Config, Flags, Imex, PluginFlags
from nvidia_device_plugin.health.registry import UnhealthyIds
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.serving.allocate import AllocationIndex, allocate
from nvidia_device_plugin.snapshot import Snapshot, build_snapshot

CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


def _session(sessions: list[NvmlSession], *dev_files: str) -> NvmlSession:
    session = open_nvml("t4-single")
    sessions.append(session)
    for name in dev_files:
        path = session.host.dev_root / name.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    return session


def _config(*strategies: str, imex: bool = False, pass_device_specs: bool = False, **flags: bool) -> Config:
    plugin = PluginFlags(device_list_strategy=strategies, pass_device_specs=pass_device_specs)  # type: ignore[arg-type]
    return Config(flags=Flags(plugin=plugin, **flags), imex=Imex(channel_ids=(0,) if imex else ()))


def _admit(snapshot: Snapshot) -> pb.ContainerAllocateResponse:
    [plan] = snapshot.plans
    index = AllocationIndex(plan, snapshot.inventory)
    response = allocate(index, [[plan.devices[0].id]], snapshot.allocation, UnhealthyIds(frozenset()))
    return response.container_responses[0]


def _kinds(snapshot: Snapshot) -> list[str]:
    assert snapshot.cdi is not None and snapshot.cdi.problem is None, snapshot.cdi
    for spec in snapshot.cdi.specs:
        assert_valid_spec(spec.document)
    return [spec.kind.removeprefix(CDI_VENDOR + "/") for spec in snapshot.cdi.specs]


def test_an_imex_channel_is_a_cdi_name_and_a_spec_under_the_cdi_strategies(
    sessions: list[NvmlSession],
) -> None:
    session = _session(sessions, CHANNEL, "/dev/gdrdrv")
    snapshot = build_snapshot(session, _config("cdi-cri", imex=True, gdrcopy_enabled=True))
    assert _kinds(snapshot) == ["gpu", "imex-channel", "gdrcopy"]
    assert snapshot.cdi is not None
    [imex] = [s for s in snapshot.cdi.specs if s.kind.endswith("/imex-channel")]
    assert imex.file_name == "k8s.device-plugin.nvidia.com-imex-channel.json"
    assert imex.document["devices"] == [
        {"name": "0", "containerEdits": {"deviceNodes": [{"path": CHANNEL, "hostPath": CHANNEL}]}}
    ]
    assert imex.document["cdiVersion"] == "0.5.0"
    response = _admit(snapshot)
    gpu = snapshot.inventory.gpus[0].uuid
    assert [d.name for d in response.cdi_devices] == [
        f"{CDI_VENDOR}/gpu={gpu}",
        f"{CDI_VENDOR}/imex-channel=0",  # after the GPUs, before the extra modes, as v0.20
        f"{CDI_VENDOR}/gdrcopy=all",
    ]
    assert not response.devices and "NVIDIA_IMEX_CHANNELS" not in response.envs


def _imex_parts(response: pb.ContainerAllocateResponse) -> tuple[str | None, list[str], list[str]]:
    return (
        response.envs.get("NVIDIA_IMEX_CHANNELS"),
        [m.container_path for m in response.mounts if "/imex/" in m.container_path],
        [d.container_path for d in response.devices if "imex" in d.container_path],
    )


def test_an_imex_channel_under_each_non_cdi_strategy_takes_v0_20s_form(sessions: list[NvmlSession]) -> None:
    session = _session(sessions, CHANNEL)

    def parts(*strategies: str, specs: bool = False) -> tuple[str | None, list[str], list[str]]:
        return _imex_parts(
            _admit(build_snapshot(session, _config(*strategies, imex=True, pass_device_specs=specs)))
        )

    assert parts("envvar") == ("0", [], [])
    assert parts("volume-mounts") == (None, ["/var/run/nvidia-container-devices/imex/0"], [])
    assert parts("envvar", specs=True) == ("0", [], [CHANNEL])
    mixed = _admit(build_snapshot(session, _config("envvar", "cdi-cri", imex=True)))
    assert f"{CDI_VENDOR}/imex-channel=0" in [d.name for d in mixed.cdi_devices]
    assert _imex_parts(mixed) == ("0", [], [])


def test_a_missing_imex_channel_is_given_in_no_form(sessions: list[NvmlSession]) -> None:
    session = _session(sessions)
    cdi = build_snapshot(session, _config("cdi-cri", imex=True))
    assert _kinds(cdi) == ["gpu"]
    assert [d.name for d in _admit(cdi).cdi_devices] == [f"{CDI_VENDOR}/gpu={cdi.inventory.gpus[0].uuid}"]
    envvar = build_snapshot(session, _config("envvar", imex=True, pass_device_specs=True))
    assert _imex_parts(_admit(envvar)) == (None, [], [])


def _extra_names(response: pb.ContainerAllocateResponse) -> list[str]:
    return [d.name for d in response.cdi_devices if "/gpu=" not in d.name]


def test_extra_modes_without_their_kernel_nodes_are_left_out_and_the_gpus_served(
    sessions: list[NvmlSession],
) -> None:
    session = _session(sessions)
    snapshot = build_snapshot(
        session, _config("cdi-cri", gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True)
    )
    assert snapshot.cdi is not None and snapshot.cdi.problem is None
    assert _kinds(snapshot) == ["gpu"]
    notes = [n for n in snapshot.cdi.notes if "Enabled is true" in n]
    assert [n.split(" ")[0] for n in notes] == ["gdrcopyEnabled", "gdsEnabled", "mofedEnabled"]
    assert "/dev/nvidia-fs*" in notes[1] and "left out" in notes[1]
    response = _admit(snapshot)
    assert _extra_names(response) == []
    assert response.envs["NVIDIA_GDS"] == "enabled"  # the variable stays, as NVIDIA sets it


def test_extra_modes_with_their_nodes_get_nvidias_nodes_and_mounts(sessions: list[NvmlSession]) -> None:
    devices = ("/dev/gdrdrv", "/dev/nvidia-fs0", "/dev/nvidia-fs1")
    infiniband = ("/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm", "/dev/infiniband/umad0")
    session = _session(sessions, *devices, *infiniband)
    assert session.host.driver_root is not None
    (session.host.driver_root / "etc").mkdir()
    (session.host.driver_root / "etc/cufile.json").write_text("{}")
    snapshot = build_snapshot(
        session, _config("cdi-cri", gdrcopy_enabled=True, gds_enabled=True, mofed_enabled=True)
    )
    assert _kinds(snapshot) == ["gpu", "gdrcopy", "gds", "mofed"]
    assert snapshot.cdi is not None
    edits = {
        s.kind.rpartition("/")[2]: s.document["devices"][0]["containerEdits"] for s in snapshot.cdi.specs[1:]
    }

    def nodes(mode: str) -> Sequence[str]:
        return [n["path"] for n in edits[mode]["deviceNodes"]]

    assert nodes("gdrcopy") == ["/dev/gdrdrv"]
    assert nodes("gds") == ["/dev/nvidia-fs0", "/dev/nvidia-fs1"]
    assert [m["containerPath"] for m in edits["gds"]["mounts"]] == ["/etc/cufile.json"]  # no /run/udev here
    assert nodes("mofed") == ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"]  # NVIDIA's two globs
    assert _extra_names(_admit(snapshot)) == [f"{CDI_VENDOR}/{m}=all" for m in ("gdrcopy", "gds", "mofed")]
