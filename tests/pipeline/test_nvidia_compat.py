"""NVIDIA v0.20's documented configs, flags and env vars, run through the daemon and checked over the wire.

Every test starts the real daemon on a simulated node and talks to it as kubelet does (the stand-in, over
unix sockets). The configs are written from NVIDIA's documented semantics. Where NVIDIA's output order is
Go map order (random), ours is deterministic, and the tests accept only ours.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, status_path, write_status
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, gpu_uuids, simulated

SHARED = "nvidia.com/gpu.shared"
IMEX_CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"


def loader(
    tmp_path: Path, text: str | None, *argv: str, env: Mapping[str, str] | None = None
) -> Callable[[], Config]:
    """How `run` resolves its config: the CLI's own parser, NVIDIA's flags and env vars, this file."""
    environ = dict(env or {})
    if text is not None:
        path = tmp_path / "config.yaml"
        path.write_text(text)
        environ["CONFIG_FILE"] = str(path)
    args: argparse.Namespace = build_parser(environ).parse_args(["run", *argv])
    return lambda: resolve_config(args, environ)


@pytest.fixture
def serve(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[Callable[..., Daemon]]:
    started: list[Daemon] = []

    def start(
        load: Callable[[], Config],
        node: str = "dgx-a100",
        resources: tuple[str, ...] = (GPU,),
        open_session: Callable[[], NvmlSession] | None = None,
    ) -> Daemon:
        daemon = Daemon(DaemonOptions(plugin_dir, load, open_session or simulated(node)))
        daemon.start()
        started.append(daemon)
        assert kubelet.wait_for_resources(list(resources))
        return daemon

    yield start
    for daemon in started:
        daemon.stop()


def time_sliced(replicas: int, policy: str | None = None) -> str:
    plugin = f"flags: {{plugin: {{sharedDevicesAllocationPolicy: {policy}}}}}\n" if policy else ""
    return plugin + (
        "sharing:\n  timeSlicing:\n    resources:\n"
        f"      - name: nvidia.com/gpu\n        replicas: {replicas}\n"
    )


def gpus_of(daemon: Daemon, ids: list[str]) -> list[int]:
    """GPU index behind each replica ID (`<uuid>::<n>`)."""
    index = {uuid: i for i, uuid in enumerate(gpu_uuids(daemon))}
    return [index[i.split("::")[0]] for i in ids]


def visible(response: pb.ContainerAllocateResponse) -> list[str]:
    return response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")


# --------------------------------------------------------------------------------------------------------
# sharedDevicesAllocationPolicy over GetPreferredAllocation


def test_distributed_is_the_default_and_spreads_8_replicas_over_8_gpus(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    daemon = serve(loader(tmp_path, time_sliced(4)))
    free = sorted(kubelet.devices(GPU))
    chosen = kubelet.preferred(GPU, free, [], 8)
    assert sorted(gpus_of(daemon, chosen)) == list(range(8))


def test_packed_fills_gpus(tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn) -> None:
    daemon = serve(loader(tmp_path, time_sliced(4, "packed")))
    free = sorted(kubelet.devices(GPU))
    assert sorted(gpus_of(daemon, kubelet.preferred(GPU, free, [], 8))) == [0, 0, 0, 0, 1, 1, 1, 1]


def test_packed_from_the_env_var_fills_the_busiest_gpu_first(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    daemon = serve(loader(tmp_path, time_sliced(4), env={"SHARED_DEVICES_ALLOCATION_POLICY": "packed"}))
    first, _ = kubelet.admit(GPU, 1)
    second, _ = kubelet.admit(GPU, 2)
    assert gpus_of(daemon, first + second) == [0, 0, 0]


def test_distributed_flag_spreads_pods_over_gpus(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    load = loader(tmp_path, time_sliced(4, "packed"), "--shared-devices-allocation-policy", "distributed")
    daemon = serve(load)
    pods = [kubelet.admit(GPU, 1)[0] for _ in range(3)]
    assert len(set(gpus_of(daemon, [i for pod in pods for i in pod]))) == 3


# --------------------------------------------------------------------------------------------------------
# NVIDIA's documented example configs


RENAMED = """
version: v1
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      rename: nvidia.com/gpu.shared
      replicas: 10
"""


def test_time_slicing_rename_is_ignored_with_nvidias_warning_as_in_v0_20(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    # v0.20's DisableResourceNamingInConfig: the replicas stay under the resource's own name.
    serve(loader(tmp_path, RENAMED))
    assert len(kubelet.devices(GPU)) == 80
    assert SHARED not in kubelet.resources()
    assert (
        "Setting the 'rename' field in sharing.timeSlicing.resources is not yet supported in the config. "
        "Ignoring..." in caplog.text
    )


@pytest.mark.parametrize(
    ("argv", "env"),
    [(("--resource-naming",), {}), ((), {"NVDP_RESOURCE_NAMING": "true"})],
    ids=["flag", "env"],
)
def test_time_slicing_with_rename_advertises_the_new_name_when_resource_naming_is_on(
    tmp_path: Path,
    serve: Callable[..., Daemon],
    kubelet: KubeletStandIn,
    argv: tuple[str, ...],
    env: dict[str, str],
) -> None:
    daemon = serve(loader(tmp_path, RENAMED, *argv, env=env), resources=(SHARED,))
    assert len(kubelet.devices(SHARED)) == 80
    ids, response = kubelet.admit(SHARED, 1)
    assert visible(response) == [ids[0].split("::")[0]]
    assert GPU not in kubelet.resources()
    assert daemon.snapshot is not None


def test_rename_by_default_and_fail_requests_greater_than_one(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    text = """
version: v1
sharing:
  timeSlicing:
    renameByDefault: true
    failRequestsGreaterThanOne: true
    resources:
    - name: nvidia.com/gpu
      replicas: 2
"""
    serve(loader(tmp_path, text), resources=(SHARED,))
    free = sorted(kubelet.devices(SHARED))
    with pytest.raises(Exception, match="maximum request size for shared resources is 1"):
        kubelet.allocate(SHARED, [free[:2]])
    response = kubelet.allocate(SHARED, [free[:1]]).container_responses[0]
    assert visible(response) == [free[0].split("::")[0]]


@pytest.mark.parametrize("naming", [False, True], ids=["v0.20-default", "resource-naming"])
def test_per_resource_devices_list_shares_only_the_listed_gpus_with_resource_naming(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn, naming: bool
) -> None:
    text = f"""
version: v1
flags:
  resourceNaming: {str(naming).lower()}
sharing:
  timeSlicing:
    resources:
    - name: nvidia.com/gpu
      replicas: 3
      devices: [0, 5]
"""
    daemon = serve(loader(tmp_path, text))
    shared = [i for i in kubelet.devices(GPU) if "::" in i]
    # v0.20 ignores the list ("Customizing the 'devices' field ... Ignoring..."): every GPU is shared.
    assert sorted(set(gpus_of(daemon, shared))) == ([0, 5] if naming else list(range(8)))
    assert len(kubelet.devices(GPU)) == (3 * 2 + 6 if naming else 3 * 8)


def test_mig_mixed_serves_each_profile(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    text = "version: v1\nflags:\n  migStrategy: mixed\n"
    profiles = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb")
    serve(loader(tmp_path, text), node="a100-mig-mixed", resources=(*profiles, GPU))
    assert len(kubelet.devices("nvidia.com/mig-1g.10gb")) == 9
    ids, response = kubelet.admit("nvidia.com/mig-3g.40gb", 1)
    assert visible(response) == ids and ids[0].startswith("MIG-")


def test_mps_config_answers_with_the_mps_environment(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    mps_root = tmp_path / "mps"
    text = f"""
version: v1
flags:
  mpsRoot: {mps_root}
sharing:
  mps:
    resources:
    - name: nvidia.com/gpu
      replicas: 4
"""
    daemon = serve(loader(tmp_path, text))
    assert daemon.snapshot is not None
    # What a running mps-control-daemon publishes: every shared GPU's server is ready.
    for gpu in daemon.snapshot.inventory.gpus:
        path = status_path(str(mps_root), GPU, gpu.uuid)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_status(path, GpuMpsStatus(ready=True, reason="running", pid=1))
    assert kubelet.wait_for(lambda: all(d.health == "Healthy" for d in kubelet.devices(GPU).values()))
    _, response = kubelet.admit(GPU, 1)
    assert response.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert "CUDA_MPS_PIPE_DIRECTORY" in response.envs


# --------------------------------------------------------------------------------------------------------
# v0.20's flags and env vars


def test_v0_20_env_vars_shape_the_allocate_response(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    env = {
        "DEVICE_LIST_STRATEGY": "volume-mounts",
        "DEVICE_ID_STRATEGY": "index",
        "PASS_DEVICE_SPECS": "true",
        "NVIDIA_DRIVER_ROOT": "/run/nvidia/driver",
        "CDI_FEATURE_FLAGS": "disable-multiple-csv-devices",
        "CDI_DISABLE_HOOKS": "update-ldcache",
        "DEVICE_DISCOVERY_STRATEGY": "nvml",
        "FAIL_ON_INIT_ERROR": "false",
    }
    daemon = serve(loader(tmp_path, None, env=env))
    _, response = kubelet.admit(GPU, 2)
    assert response.envs["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    assert [m.container_path for m in response.mounts] == [
        "/var/run/nvidia-container-devices/0",
        "/var/run/nvidia-container-devices/1",
    ]
    assert "/run/nvidia/driver/dev/nvidia0" in [d.host_path for d in response.devices]
    assert daemon.snapshot is not None
    assert daemon.snapshot.config.flags.plugin.cdi_disable_hooks == ("update-ldcache",)


def test_v0_20_cdi_flags_reach_the_response(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    argv = ("--device-list-strategy", "cdi-cri", "--cdi-feature-flags", "a,b", "--cdi-disable-hooks", "x")
    serve(loader(tmp_path, None, *argv))
    ids, response = kubelet.admit(GPU, 1)
    assert [d.name for d in response.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={ids[0]}"]
    assert "NVIDIA_VISIBLE_DEVICES" not in response.envs


# --------------------------------------------------------------------------------------------------------
# WSL2 nodes: NVIDIA's wslDevice (internal/rm) gives every GPU the one node /dev/dxg

WSL2_NODE = str(Path(__file__).parent / "data" / "wsl2-rtx.yaml")  # a simulated node file with `wsl: true`


def test_a_wsl2_node_gives_each_gpu_dev_dxg_and_no_linux_driver_nodes(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    daemon = serve(loader(tmp_path, None, env={"PASS_DEVICE_SPECS": "true"}), node=WSL2_NODE)
    assert daemon.snapshot is not None
    [uuid] = [g.uuid for g in daemon.snapshot.inventory.gpus]
    ids, response = kubelet.admit(GPU, 1)
    assert ids == [uuid] and response.envs["NVIDIA_VISIBLE_DEVICES"] == uuid
    # No /dev/nvidia<N> and no control node exist on WSL2: /dev/dxg alone, as NVIDIA's GetPaths gives it.
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/dxg", "/dev/dxg", "rw")
    ]


def test_a_wsl2_nodes_cdi_spec_gives_each_gpu_dev_dxg_and_the_driver_store(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    """NVIDIA's toolkit WSL2 edits (pkg/nvcdi lib-wsl.go, driver-wsl.go): /dev/dxg, its required files from
    the driver store then /usr/lib/wsl/lib, the nvidia-smi link and update-ldcache over their directories."""
    env = {"DEVICE_LIST_STRATEGY": "cdi-cri", "NVIDIA_CDI_HOOK_PATH": "/usr/bin/nvidia-cdi-hook"}
    daemon = serve(loader(tmp_path, None, env=env), node=WSL2_NODE)
    ids, response = kubelet.admit(GPU, 1)
    assert [d.name for d in response.cdi_devices] == [f"k8s.device-plugin.nvidia.com/gpu={ids[0]}"]
    assert daemon.snapshot is not None and daemon.snapshot.cdi is not None
    assert daemon.snapshot.cdi.problem is None, daemon.snapshot.cdi.problem
    [spec] = [s.document for s in daemon.snapshot.cdi.specs]
    assert spec["devices"] == [
        {"name": ids[0], "containerEdits": {"deviceNodes": [{"path": "/dev/dxg", "hostPath": "/dev/dxg"}]}}
    ]
    store = "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_0123456789abcdef"
    files = [
        f"{store}/libcuda.so.1.1",
        f"{store}/libcuda_loader.so",
        f"{store}/libnvidia-ptxjitcompiler.so.1",
        f"{store}/libnvidia-ml.so.1",
        f"{store}/libnvidia-ml_loader.so",
        "/usr/lib/wsl/lib/libdxcore.so",  # not in the store: the next directory searched
        f"{store}/libnvdxgdmal.so.1",
        f"{store}/nvcubins.bin",
        f"{store}/nvidia-smi",
    ]
    common = spec["containerEdits"]
    assert [(m["containerPath"], m["hostPath"]) for m in common["mounts"]] == [(f, f) for f in files]
    assert [h["args"] for h in common["hooks"]] == [
        ["nvidia-cdi-hook", "create-symlinks", "--link", f"{store}/nvidia-smi::/usr/bin/nvidia-smi"],
        ["nvidia-cdi-hook", "update-ldcache", "--folder", store, "--folder", "/usr/lib/wsl/lib"],
    ]
    assert "deviceNodes" not in common  # no control nodes on WSL2


# --------------------------------------------------------------------------------------------------------
# Stray keys, spelling, tegra


def test_daemon_serves_a_config_with_unknown_keys_and_reports_each(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    text = time_sliced(2) + "flags:\n  plugin:\n    passDeviceSpec: true\n  migstrategy: none\n"
    with caplog.at_level(logging.WARNING, logger="nvidia_device_plugin"):
        daemon = serve(loader(tmp_path, text))
    assert len(kubelet.devices(GPU)) == 16
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(
        "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)" in w for w in warnings
    )
    assert any("flags.migstrategy: read as migStrategy" in w for w in warnings)
    body, _ = daemon.metrics.render("text/plain")
    lines = [
        line for line in body.decode().splitlines() if line.startswith("nvidia_device_plugin_config_unknown")
    ]
    assert lines == ['nvidia_device_plugin_config_unknown_keys{key="flags.plugin.passDeviceSpec"} 1.0']


def test_tegra_is_logged_as_unsupported(
    tmp_path: Path, serve: Callable[..., Daemon], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="nvidia_device_plugin"):
        serve(loader(tmp_path, "flags: {deviceDiscoveryStrategy: tegra}"))
    assert [r.getMessage() for r in caplog.records if "tegra" in r.getMessage()] == [
        "deviceDiscoveryStrategy tegra is not supported: devices are discovered through NVML"
    ]


# --------------------------------------------------------------------------------------------------------
# IMEX


def with_imex_channel(node: str) -> Callable[[], NvmlSession]:
    """A simulated node whose /dev has IMEX channel 0, as a node running the IMEX daemon has."""

    def open_session() -> NvmlSession:
        session = open_nvml(node)
        channel = session.host.dev_root / IMEX_CHANNEL.lstrip("/")
        channel.parent.mkdir(parents=True, exist_ok=True)
        channel.touch()
        return session

    return open_session


IMEX_CONFIG = "flags: {nvidiaDevRoot: /run/nvidia/driver}\nimex: {channelIDs: [0], required: true}\n"


def test_imex_channel_is_injected_into_every_container(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="nvidia_device_plugin"):
        serve(loader(tmp_path, IMEX_CONFIG), open_session=with_imex_channel("dgx-a100"))
    assert f"imex: injecting {IMEX_CHANNEL} into every container (present; required)" in caplog.messages
    free = sorted(kubelet.devices(GPU))
    response = kubelet.allocate(GPU, [free[:1], free[1:3]])
    for container in response.container_responses:
        # v0.20 under envvar (the default): the variable, and no device spec without passDeviceSpecs.
        assert container.envs["NVIDIA_IMEX_CHANNELS"] == "0"
        assert list(container.devices) == []


def test_imex_from_the_v0_20_flags(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn
) -> None:
    serve(
        loader(tmp_path, None, "--imex-channel-ids", "0", "--imex-required", "--pass-device-specs",
               "--dev-root", "/run/nvidia/driver"),
        open_session=with_imex_channel("t4-single"),
    )  # fmt: skip
    _, response = kubelet.admit(GPU, 1)
    # With passDeviceSpecs, v0.20 passes the channel's device spec too, after the GPU's.
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices][-1] == (
        IMEX_CHANNEL,
        "/run/nvidia/driver" + IMEX_CHANNEL,
        "rw",
    )
    assert response.envs["NVIDIA_IMEX_CHANNELS"] == "0"


def test_required_imex_channel_missing_refuses_to_serve(plugin_dir: Path, tmp_path: Path) -> None:
    daemon = Daemon(DaemonOptions(plugin_dir, loader(tmp_path, IMEX_CONFIG), simulated("dgx-a100")))
    try:
        with pytest.raises(
            ConfigError, match=f"imex.required is true but IMEX channel {IMEX_CHANNEL} does not exist"
        ):
            daemon.start()
    finally:
        daemon.stop()


def test_imex_not_required_and_missing_serves_without_the_channel(
    tmp_path: Path, serve: Callable[..., Daemon], kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="nvidia_device_plugin"):
        serve(loader(tmp_path, "imex: {channelIDs: [0]}"))
    assert any("missing, not injected until it appears; not required" in m for m in caplog.messages)
    _, response = kubelet.admit(GPU, 1)
    assert list(response.devices) == []
