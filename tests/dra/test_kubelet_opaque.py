"""NVIDIA's opaque config (GpuConfig, MigDeviceConfig) through the real socket, as kubelet prepares claims:
time-slices set on the simulated node, a control daemon per MPS claim (the fake nvidia-cuda-mps-control of
tests/sharing) and its client edits in the claim's CDI spec, claim config over class config, refusals that
name the bad kind, field or value, conflicting sharing on one GPU refused, and a restart that adopts a
prepared claim's daemon. Only processes the fake control binary started are ever signalled (by their ids)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest

from nvidia_device_plugin.config.loader import parse_config
from nvidia_device_plugin.dra.kubelet.claim_sharing import ClaimSharing, config_sharing_of, plan_sharing
from nvidia_device_plugin.dra.kubelet.claims import AllocationResult
from nvidia_device_plugin.dra.kubelet.model import ClaimError, PreparedSharing
from nvidia_device_plugin.dra.kubelet.opaque import opaque_configs
from nvidia_device_plugin.dra.names import DRIVER_NAME
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.nvml.sim.timeslice import SimulatedTimeSlice
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, read_status, status_path, write_status
from nvidia_device_plugin.snapshot import build_snapshot

from support.dra_kubelet import DraKubeletStandIn, DraNode, dra_node, resource_claim, simulated_node
from support.fake_mps import install_fake_control, kill_fake_daemons, lines
from support.waiting import wait_for

UID = "0f3c6b1e-1111-4a5e-9d7e-000000000001"
OTHER = "0f3c6b1e-2222-4a5e-9d7e-000000000002"
CLAIM = ("default", "gpu-claim", UID)
OTHER_CLAIM = ("default", "other", OTHER)
API = "resource.nvidia.com/v1beta1"
THEIRS = {"source": "FromClaim", "opaque": {"driver": "nic.example.com", "parameters": {"kind": "Any"}}}


def config(parameters: dict[str, Any], source: str = "FromClaim", requests: list[str] | None = None) -> dict:
    entry: dict[str, Any] = {"source": source, "opaque": {"driver": DRIVER_NAME, "parameters": parameters}}
    if requests is not None:
        entry["requests"] = requests
    return entry


def gpu_config(sharing: dict[str, Any] | None = None, kind: str = "GpuConfig") -> dict[str, Any]:
    return {"apiVersion": API, "kind": kind, **({"sharing": sharing} if sharing is not None else {})}


def time_slicing(interval: str) -> dict[str, Any]:
    return {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}


class Node:
    """A DRA node whose plugin sets claims' sharing: simulated time-slices, the fake MPS control binary."""

    def __init__(self, dra: DraNode) -> None:
        self.dra = dra
        self.mps_root = dra.root / "mps"
        self.control = install_fake_control(dra.root)
        self.time_slice = SimulatedTimeSlice([d.uuid for d in dra.node.devices.values()])
        self.ready_timeout_s = 20.0

    def plugin(self) -> None:
        sharing = ClaimSharing(
            time_slice=self.time_slice,
            mps_root=str(self.mps_root),
            control_path=self.control,
            check_interval_s=0.02,
            ready_timeout_s=self.ready_timeout_s,
            base_env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        )
        self.dra.plugin(sharing=sharing)

    def uuid(self, device: str) -> str:
        return self.dra.node.devices[device].uuid

    def pipe(self, uid: str) -> Path:
        return self.mps_root / "claims" / uid / "pipe"

    def daemon_pid(self, uid: str) -> int:
        return int((self.pipe(uid) / "nvidia-cuda-mps-control.pid").read_text())

    def daemon_running(self, uid: str) -> bool:
        return (self.pipe(uid) / "nvidia-cuda-mps-control.pid").exists() and alive(self.daemon_pid(uid))


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in state


@pytest.fixture
def node() -> Iterator[Node]:
    for dra in dra_node():
        node = Node(dra)
        try:
            yield node
        finally:
            for plugin in dra.started:
                plugin.stop()
            kill_fake_daemons(dra.root)


@pytest.fixture
def kubelet(node: Node) -> Iterator[DraKubeletStandIn]:
    node.plugin()
    with DraKubeletStandIn(node.dra.registry_dir) as k:
        k.driver()
        yield k


def put(
    node: Node,
    uid: str,
    configs: list[dict[str, Any]],
    name: str = "gpu-claim",
    device: str = "gpu-0",
    results: list[tuple[str, str]] | None = None,
) -> None:
    node.dra.api.claims.put(
        resource_claim(uid, name=name, results=results or [("gpu", device)], config=configs)
    )


def checkpoint_sharing(node: Node, uid: str) -> list[dict[str, Any]]:
    document = json.loads(node.dra.checkpoint.read_text())
    sharing: list[dict[str, Any]] = document["claims"][uid]["sharing"]
    return sharing


# ---- time-slicing ---------------------------------------------------------------------------------


def test_time_slicing_sets_the_gpus_interval_and_the_checkpoint_records_it(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config(time_slicing("Long")))], device="gpu-2")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    assert node.time_slice.interval(node.uuid("gpu-2")) == "Long"
    assert node.time_slice.sets == [(node.uuid("gpu-2"), "Long")]
    assert checkpoint_sharing(node, UID) == [
        {
            "gpuUUID": node.uuid("gpu-2"),
            "mode": "time-slicing",
            "interval": "Long",
            "activeThreadPercentage": None,
            "pinnedMemoryLimitMiB": None,
        }
    ]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in json.dumps(node.dra.spec(UID))


def test_a_gpu_config_without_sharing_is_time_slicing_at_the_default_interval(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config())])
    assert kubelet.prepare([CLAIM])[UID].error == ""
    assert node.time_slice.sets == [(node.uuid("gpu-0"), "Default")]


def test_claim_config_wins_over_class_config_and_requests_say_which_results_it_applies_to(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    configs = [
        config(gpu_config(time_slicing("Long")), requests=["train"]),  # claim config, listed first
        config(gpu_config(time_slicing("Short")), source="FromClass"),
        config(gpu_config(time_slicing("Medium")), requests=["nothing-here"]),
    ]
    put(node, UID, configs, results=[("train", "gpu-1"), ("eval/small", "gpu-2")])
    assert kubelet.prepare([CLAIM])[UID].error == ""
    assert node.time_slice.interval(node.uuid("gpu-1")) == "Long"
    assert node.time_slice.interval(node.uuid("gpu-2")) == "Short"


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (pynvml.NVML_ERROR_NOT_SUPPORTED, "Not Supported"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions (the container needs CAP_SYS_ADMIN)"),
    ],
)
def test_a_time_slice_the_gpu_refuses_refuses_the_claim_until_it_can_be_set(
    node: Node, kubelet: DraKubeletStandIn, code: int, reason: str
) -> None:
    put(node, UID, [config(gpu_config(time_slicing("Short")))])
    node.time_slice.fail(node.uuid("gpu-0"), code)
    error = kubelet.prepare([CLAIM])[UID].error
    assert f"cannot set time-slice Short on GPU {node.uuid('gpu-0')}: {reason}" in error
    assert node.dra.started[0].prepared() == {}  # not kept: kubelet prepares it again
    node.time_slice.clear(node.uuid("gpu-0"))
    assert kubelet.prepare([CLAIM])[UID].error == ""
    assert node.time_slice.interval(node.uuid("gpu-0")) == "Short"


def test_two_claims_asking_one_gpu_for_different_sharing_are_refused_the_second(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config(time_slicing("Short")))])
    put(node, OTHER, [config(gpu_config(time_slicing("Long")))], name="other")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    error = kubelet.prepare([OTHER_CLAIM])[OTHER].error
    assert (
        f"GPU {node.uuid('gpu-0')} is shared as time-slicing (interval Short) by claim default/gpu-claim"
        in error
    )
    assert "this claim asks time-slicing (interval Long)" in error
    assert node.time_slice.interval(node.uuid("gpu-0")) == "Short"
    assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert kubelet.prepare([OTHER_CLAIM])[OTHER].error == ""  # the GPU is free again


def test_one_claims_two_configs_asking_one_gpu_differently_are_refused(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    configs = [
        config(gpu_config(time_slicing("Short")), requests=["a"]),
        config(gpu_config(time_slicing("Long")), requests=["b"]),
    ]
    put(node, UID, configs, results=[("a", "gpu-0"), ("b", "gpu-0")])
    error = kubelet.prepare([CLAIM])[UID].error
    assert "device gpu-0 is asked time-slicing (interval Short)" in error
    assert (
        "and time-slicing (interval Long) (status.allocation.devices.config[1] (FromClaim) GpuConfig)"
        in error
    )


# ---- MPS ------------------------------------------------------------------------------------------

MPS_CONFIG = {
    "strategy": "MPS",
    "mpsConfig": {"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "10Gi"},
}


def test_mps_starts_the_claims_control_daemon_before_answering_and_unprepare_quits_it(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config(MPS_CONFIG))], device="gpu-3")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    pipe = node.pipe(UID)
    assert node.daemon_running(UID)
    pid = node.daemon_pid(UID)
    assert lines(pipe / "launches") == ["-d"]
    env = dict(line.split("=", 1) for line in lines(pipe / "daemon.env") if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == node.uuid("gpu-3")
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert lines(pipe / "commands") == [
        "set_default_device_pinned_mem_limit 0 10240M",
        "set_default_active_thread_percentage 50",
    ]
    edits = node.dra.spec(UID)["containerEdits"]
    container = f"/mps/claims/{UID}"
    assert edits["env"][-4:] == [
        f"CUDA_MPS_PIPE_DIRECTORY={container}/pipe",
        f"CUDA_MPS_LOG_DIRECTORY={container}/log",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=10240M",
    ]
    mounts = {m["containerPath"]: m["hostPath"] for m in edits["mounts"]}
    assert mounts[f"{container}/pipe"] == str(pipe)
    assert mounts["/dev/shm"] == str(node.mps_root / "shm")
    assert node.time_slice.sets == []
    assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert not alive(pid)
    assert not pipe.parent.exists()  # its directories go with it


def test_a_restart_adopts_a_prepared_claims_daemon_instead_of_starting_a_second(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config({"strategy": "MPS"}))])
    assert kubelet.prepare([CLAIM])[UID].error == ""
    pipe = node.pipe(UID)
    pid = node.daemon_pid(UID)
    node.dra.started[0].stop()  # a restart: the daemon keeps running for its clients
    assert node.daemon_running(UID)
    (pipe.parent / "status.json").unlink()  # the successor says ready again once it has the daemon
    node.plugin()
    assert kubelet.prepare([CLAIM])[UID].error == ""  # answered from the checkpoint, through the new plugin
    wait_for(lambda: read_status(str(pipe.parent / "status.json")).ready, "the daemon adopted")
    assert read_status(str(pipe.parent / "status.json")).pid == pid
    assert lines(pipe / "launches") == ["-d"]  # never a second daemon
    assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert not alive(pid) and not pipe.exists()  # nor one left behind


def test_a_daemon_whose_checkpoint_entry_was_lost_is_quit_at_unprepare(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config({"strategy": "MPS"}))])
    assert kubelet.prepare([CLAIM])[UID].error == ""
    node.dra.started[0].stop()
    node.dra.checkpoint.write_text("{not json")  # set aside at the next start: the claim is forgotten
    node.plugin()
    pid = node.daemon_pid(UID)
    assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert not alive(pid) and not node.pipe(UID).exists()


def test_a_second_claim_next_to_an_mps_claim_is_refused(node: Node, kubelet: DraKubeletStandIn) -> None:
    put(node, UID, [config(gpu_config({"strategy": "MPS"}))])
    put(node, OTHER, [config(gpu_config({"strategy": "MPS"}))], name="other")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    error = kubelet.prepare([OTHER_CLAIM])[OTHER].error
    assert "is shared as mps by claim default/gpu-claim" in error and "an MPS claim's GPU is its own" in error
    assert not node.pipe(OTHER).exists()


def test_a_plain_claim_and_an_mps_claim_never_share_a_gpu(node: Node, kubelet: DraKubeletStandIn) -> None:
    put(node, UID, [])  # no config: the GPU held as it is
    put(node, OTHER, [config(gpu_config({"strategy": "MPS"}))], name="other")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    error = kubelet.prepare([OTHER_CLAIM])[OTHER].error
    assert f"GPU {node.uuid('gpu-0')} is held, with no sharing set up, by claim default/gpu-claim" in error
    assert "this claim asks mps; an MPS claim's GPU is its own" in error
    assert kubelet.unprepare([CLAIM])[UID].error == ""
    assert kubelet.prepare([OTHER_CLAIM])[OTHER].error == ""
    assert "this claim asks no sharing; an MPS claim's GPU is its own" in kubelet.prepare([CLAIM])[UID].error


def test_mps_across_gpus_is_refused(node: Node, kubelet: DraKubeletStandIn) -> None:
    put(node, UID, [config(gpu_config({"strategy": "MPS"}))], results=[("gpu", "gpu-0"), ("gpu", "gpu-1")])
    error = kubelet.prepare([CLAIM])[UID].error
    assert "MPS is asked for devices on 2 GPUs" in error and "must be on one GPU" in error


# ---- a node whose config shares GPUs through MPS (mps-control-daemon's daemons) -------------------

CONFIG_MPS_ON_GPU_1 = {
    "version": "v1",
    "flags": {"resourceNaming": True},  # so `devices` selects: gpu-1 alone is MPS-shared by the config
    "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 2, "devices": [1]}]}},
}


@pytest.fixture
def config_mps(node: Node) -> None:
    """The node's config shares gpu-1 through MPS, as the DRA mode's node view reads it from the plans."""
    session = open_nvml("dgx-a100")
    try:
        plans = build_snapshot(session, parse_config(CONFIG_MPS_ON_GPU_1)).plans
    finally:
        session.close()
    node.dra.node = replace(node.dra.node, config_sharing=config_sharing_of(plans))
    config_daemon_status(node, GpuMpsStatus(True, "running"))


def config_daemon_status(node: Node, status: GpuMpsStatus) -> None:
    """What mps-control-daemon says of gpu-1's control daemon (its status file under the MPS root)."""
    write_status(status_path(str(node.mps_root), "nvidia.com/gpu", node.uuid("gpu-1")), status)


def put_shares(node: Node, uid: str, name: str, shares: str) -> None:
    """A claim of gpu-1 whose result consumed `shares` of its `shares` capacity (KEP-5075)."""
    claim = resource_claim(uid, name=name, results=[("gpu", "gpu-1")])
    claim["status"]["allocation"]["devices"]["results"][0]["consumedCapacity"] = {"shares": shares}
    node.dra.api.claims.put(claim)


@pytest.mark.parametrize("sharing", [{"strategy": "MPS"}, time_slicing("Long")], ids=["mps", "time-slicing"])
def test_a_claims_sharing_on_a_gpu_the_config_shares_through_mps_is_refused_naming_it(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn, sharing: dict[str, Any]
) -> None:
    put(node, UID, [config(gpu_config(sharing))], device="gpu-1")
    error = kubelet.prepare([CLAIM])[UID].error
    assert (
        f"GPU {node.uuid('gpu-1')} is shared through MPS by this node's config (sharing.mps, resource "
        "nvidia.com/gpu)" in error
    )
    assert "remove the sharing config from the claim" in error.lower()
    assert node.time_slice.sets == [] and not node.pipe(UID).exists()
    assert node.dra.started[0].prepared() == {}  # nothing recorded: kubelet retries it
    put(node, UID, [])  # the same GPU with no sharing asked: served as it is
    assert kubelet.prepare([CLAIM])[UID].error == ""


def test_a_gpu_the_config_does_not_share_through_mps_still_takes_a_claims_sharing(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [config(gpu_config({"strategy": "MPS"}))], device="gpu-2")
    put(node, OTHER, [config(gpu_config(time_slicing("Short")))], name="other", device="gpu-3")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    assert kubelet.prepare([OTHER_CLAIM])[OTHER].error == ""
    assert node.daemon_running(UID)
    assert node.time_slice.interval(node.uuid("gpu-3")) == "Short"
    assert kubelet.unprepare([CLAIM])[UID].error == ""


def test_claims_on_a_gpu_the_config_shares_through_mps_are_clients_of_its_daemon_with_a_replicas_limits(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn
) -> None:
    put(node, UID, [], device="gpu-1")
    put(node, OTHER, [], name="other", device="gpu-1")  # a second claim shares the GPU, as replicas do
    assert kubelet.prepare([CLAIM])[UID].error == ""
    assert kubelet.prepare([OTHER_CLAIM])[OTHER].error == ""
    half_mib = node.dra.node.devices["gpu-1"].gpu.memory_bytes // 2 // 2**20
    daemon = node.mps_root / "nvidia.com/gpu" / node.uuid("gpu-1")
    for uid in (UID, OTHER):
        edits = node.dra.spec(uid)["containerEdits"]
        assert edits["env"][-4:] == [
            "CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe",
            "CUDA_MPS_LOG_DIRECTORY=/mps/nvidia.com/gpu/log",
            f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={half_mib}M",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        ]
        mounts = {m["containerPath"]: (m["hostPath"], m["options"][0]) for m in edits["mounts"]}
        assert mounts["/mps/nvidia.com/gpu/pipe"] == (str(daemon / "pipe"), "rw")
        assert mounts["/mps/nvidia.com/gpu/log"] == (str(daemon / "log"), "ro")
        assert mounts["/dev/shm"] == (str(node.mps_root / "shm"), "rw")
        assert not node.pipe(uid).exists()  # no daemon of the claim's own: the config's serves it
    assert node.time_slice.sets == []


def test_a_claim_that_consumed_both_shares_gets_both_replicas_limits(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn
) -> None:
    put_shares(node, UID, "gpu-claim", "2")
    assert kubelet.prepare([CLAIM])[UID].error == ""
    env = node.dra.spec(UID)["containerEdits"]["env"]
    whole_mib = node.dra.node.devices["gpu-1"].gpu.memory_bytes // 2 // 2**20 * 2
    assert f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={whole_mib}M" in env
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100" in env


def test_consumed_shares_that_are_no_whole_number_refuse_the_claim(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn
) -> None:
    put_shares(node, UID, "gpu-claim", "1.5")
    error = kubelet.prepare([CLAIM])[UID].error
    assert "consumedCapacity shares '1.5' is not a whole number of shares" in error


def test_a_claim_on_a_gpu_whose_config_daemon_is_not_ready_is_refused_with_its_reason(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn
) -> None:
    config_daemon_status(node, GpuMpsStatus(False, "exited"))
    put(node, UID, [], device="gpu-1")
    error = kubelet.prepare([CLAIM])[UID].error
    assert (
        f"GPU {node.uuid('gpu-1')} is shared through MPS by this node's config (sharing.mps, resource "
        "nvidia.com/gpu), whose control daemon is not ready: exited" in error
    )
    assert node.dra.started[0].prepared() == {}  # nothing recorded: kubelet retries it
    config_daemon_status(node, GpuMpsStatus(True, "running"))
    assert kubelet.prepare([CLAIM])[UID].error == ""


def test_a_claim_whose_devices_would_be_clients_of_two_mps_daemons_is_refused(
    config_mps: None, node: Node, kubelet: DraKubeletStandIn
) -> None:
    mps_on_b = config(gpu_config({"strategy": "MPS"}), requests=["b"])
    put(node, UID, [mps_on_b], results=[("a", "gpu-1"), ("b", "gpu-2")])
    error = kubelet.prepare([CLAIM])[UID].error
    assert f"devices on GPUs {node.uuid('gpu-1')}, {node.uuid('gpu-2')} are each MPS clients" in error
    assert node.dra.started[0].prepared() == {} and not node.pipe(UID).exists()


def test_a_daemon_that_cannot_start_refuses_the_claim_with_its_reason(node: Node) -> None:
    node.ready_timeout_s = 1.0  # a claim the daemon cannot serve is refused sooner
    node.plugin()
    (node.dra.root / "refuse-start").write_text("")
    put(node, UID, [config(gpu_config({"strategy": "MPS"}))])
    with DraKubeletStandIn(node.dra.registry_dir) as kubelet:
        error = kubelet.prepare([CLAIM])[UID].error
    assert "the MPS control daemon for GPU" in error and "refusing to start (test)" in error
    assert node.dra.started[0].prepared() == {}


def test_a_plugin_without_sharing_refuses_a_claim_whose_config_asks_for_it(node: Node) -> None:
    node.dra.plugin()  # no ClaimSharing
    put(node, UID, [config(gpu_config(time_slicing("Short")))])
    with DraKubeletStandIn(node.dra.registry_dir) as kubelet:
        error = kubelet.prepare([CLAIM])[UID].error
    assert "its opaque config asks for sharing, which this plugin was started without" in error


# ---- refusals that name the problem ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        (
            {"apiVersion": "resource.nvidia.com/v1", "kind": "GpuConfig"},
            "apiVersion 'resource.nvidia.com/v1' is not",
        ),
        (gpu_config(kind="TpuConfig"), "unknown kind 'TpuConfig' (known: GpuConfig, MigDeviceConfig)"),
        ({**gpu_config(), "shraing": {}}, "GpuConfig: unknown field(s) shraing"),
        (gpu_config({"strategy": "Spatial"}), "unknown sharing.strategy 'Spatial'"),
        (gpu_config({"strategy": "Fabric"}), "Fabric is not enabled"),
        (gpu_config(time_slicing("Forever")), "unknown time-slice interval 'Forever'"),
        (
            gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"intervall": "Long"}}),
            "unknown field(s) intervall",
        ),
        (
            gpu_config({"strategy": "TimeSlicing", "mpsConfig": {}}),
            "sharing.mpsConfig cannot be used with the TimeSlicing",
        ),
        (
            gpu_config({"strategy": "MPS", "timeSlicingConfig": {}}),
            "sharing.timeSlicingConfig cannot be used with the MPS",
        ),
        (
            gpu_config(time_slicing("Long"), kind="MigDeviceConfig"),
            "MigDeviceConfig sharing: unknown field(s) timeSlicingConfig",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}),
            "defaultActiveThreadPercentage must be an integer 0..100, got 101",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "lots"}}),
            "defaultPinnedDeviceMemoryLimit: 'lots' is not a quantity",
        ),
        (
            gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "1Ki"}}}),
            "defaultPerDevicePinnedMemoryLimit[0]: '1Ki' is under 1 MiB",
        ),
        (gpu_config({"strategy": "MPS", "mpsConfig": {"maxClients": 4}}), "unknown field(s) maxClients"),
    ],
)
def test_a_bad_config_is_refused_naming_the_kind_field_or_value(
    parameters: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClaimError) as raised:
        opaque_configs([THEIRS, config(parameters)], DRIVER_NAME)
    assert "status.allocation.devices.config[1] (FromClaim)" in str(raised.value)
    assert message in str(raised.value)


def test_a_bad_config_is_the_claims_error_through_the_socket(node: Node, kubelet: DraKubeletStandIn) -> None:
    put(node, UID, [config(gpu_config(time_slicing("Forever")))])
    error = kubelet.prepare([CLAIM])[UID].error
    assert error.startswith(f"prepare of claim default/gpu-claim (UID {UID}) refused: ")
    assert "unknown time-slice interval 'Forever'" in error
    assert node.time_slice.sets == []


def test_a_per_device_limit_naming_no_device_of_the_claim_is_refused(
    node: Node, kubelet: DraKubeletStandIn
) -> None:
    mps = {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}}
    put(node, UID, [config(gpu_config(mps))])
    error = kubelet.prepare([CLAIM])[UID].error
    assert "defaultPerDevicePinnedMemoryLimit names 3, no MPS device of this claim" in error


# ---- MIG devices (pure: plan_sharing on a simulated MIG node) -------------------------------------


@pytest.fixture(scope="module")
def mig_devices() -> Iterator[dict[str, Any]]:
    session, devices = simulated_node("a100-mig-mixed")
    try:
        yield dict(devices.devices)
    finally:
        session.close()


MIG = "gpu-0-mig-1g10gb-0-1"


def plan(devices: dict[str, Any], configs: list[dict[str, Any]], device: str = MIG) -> tuple[Any, ...]:
    results = [AllocationResult("mig", "pool", device, "mig")]
    return plan_sharing(results, opaque_configs(configs, DRIVER_NAME), devices)


def test_time_slicing_a_mig_device_records_its_gpu_and_sets_no_interval(mig_devices: dict[str, Any]) -> None:
    sharing = plan(mig_devices, [config(gpu_config({"strategy": "TimeSlicing"}, kind="MigDeviceConfig"))])
    assert sharing == (PreparedSharing(mig_devices[MIG].gpu.uuid, "time-slicing"),)


def test_mps_on_a_mig_device_is_refused(mig_devices: dict[str, Any]) -> None:
    with pytest.raises(ClaimError, match=f"MigDeviceConfig: mps cannot share MIG device {MIG}"):
        plan(mig_devices, [config(gpu_config({"strategy": "MPS"}, kind="MigDeviceConfig"))])


def test_a_config_naming_a_request_of_the_other_kind_of_device_is_refused(
    mig_devices: dict[str, Any],
) -> None:
    with pytest.raises(
        ClaimError, match=f"a GpuConfig names request 'mig', whose device {MIG} is a MIG device"
    ):
        plan(mig_devices, [config(gpu_config(), requests=["mig"])])
    with pytest.raises(
        ClaimError, match="a MigDeviceConfig names request 'mig', whose device gpu-1 is a whole"
    ):
        plan(mig_devices, [config(gpu_config(kind="MigDeviceConfig"), requests=["mig"])], device="gpu-1")


def test_a_config_for_every_request_applies_only_to_devices_of_its_kind(mig_devices: dict[str, Any]) -> None:
    assert plan(mig_devices, [config(gpu_config(time_slicing("Long")))]) == ()
