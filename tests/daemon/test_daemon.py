"""The whole daemon on simulated nodes, driven the way kubelet drives it, over real unix sockets."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from nvidia_device_plugin.base.errors import ConfigError, NvmlError
from nvidia_device_plugin.config.v1 import Config, Flags, Recovery
from nvidia_device_plugin.config.v1 import Health as HealthConfig
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids, simulated_options, simulator, start_daemon
from support.kubelet_standin import kubelet_standin
from support.waiting import scaled


def test_advertises_every_gpu_with_numa(daemon: Daemon, kubelet: KubeletStandIn) -> None:
    registration = next(r for r in kubelet.registrations if r.resource_name == GPU)
    assert registration.endpoint == "nvidia-gpu.sock"
    assert registration.options.get_preferred_allocation_available
    devices = kubelet.devices(GPU)
    assert sorted(devices) == sorted(gpu_uuids(daemon))
    numa = {d: [n.ID for n in devices[d].topology.nodes] for d in devices}
    assert [numa[u] for u in gpu_uuids(daemon)] == [[0]] * 4 + [[1]] * 4
    assert {d.health for d in devices.values()} == {"Healthy"}


def test_allocate_returns_visible_devices_per_container(daemon: Daemon, kubelet: KubeletStandIn) -> None:
    uuids = gpu_uuids(daemon)
    response = kubelet.allocate(GPU, [[uuids[2], uuids[0]], [uuids[5]]])
    envs = [dict(c.envs) for c in response.container_responses]
    assert envs[0]["NVIDIA_VISIBLE_DEVICES"] == f"{uuids[2]},{uuids[0]}"
    assert envs[1]["NVIDIA_VISIBLE_DEVICES"] == uuids[5]


def test_allocate_rejects_unknown_ids_and_keeps_serving(daemon: Daemon, kubelet: KubeletStandIn) -> None:
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(GPU, [["GPU-not-a-real-one"]])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "GPU-not-a-real-one" in err.value.details()
    uuid = gpu_uuids(daemon)[1]
    assert kubelet.allocate(GPU, [[uuid]]).container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"] == uuid


def test_xid_marks_device_unhealthy_and_allocate_refuses_it(daemon: Daemon, kubelet: KubeletStandIn) -> None:
    uuid = gpu_uuids(daemon)[3]
    simulator(daemon).inject_xid(3, 79)
    assert kubelet.wait_for(lambda: kubelet.devices(GPU)[uuid].health == "Unhealthy", timeout=scaled(5))
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(GPU, [[uuid]])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert uuid in err.value.details() and "unhealthy" in err.value.details()


def test_preferred_allocation_over_the_wire(daemon: Daemon, kubelet: KubeletStandIn) -> None:
    uuids = gpu_uuids(daemon)
    chosen = kubelet.preferred(GPU, uuids, [uuids[5]], 4)
    assert len(chosen) == 4 and uuids[5] in chosen
    assert set(chosen) <= set(uuids)


def test_starts_before_kubelet(plugin_dir: Path) -> None:
    daemon = start_daemon(plugin_dir, "t4-single")
    try:
        assert (plugin_dir / "nvidia-gpu.sock").exists()
        with kubelet_standin(plugin_dir) as kubelet:
            assert kubelet.wait_for_resources([GPU])
            assert len(kubelet.devices(GPU)) == 1
            device = next(iter(kubelet.devices(GPU).values()))
            assert not device.HasField("topology")  # the T4 box's sysfs does not know its NUMA node
    finally:
        daemon.stop()
    assert not (plugin_dir / "nvidia-gpu.sock").exists()


def test_reload_applies_new_replicas_without_restart(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    from nvidia_device_plugin.config.v1 import ReplicatedResource, ReplicatedResources, Sharing

    configs = [Config()]
    daemon = Daemon(simulated_options(plugin_dir, load_config=lambda: configs[-1]))
    daemon.start()
    try:
        assert kubelet.wait_for_resources([GPU])
        shared = Sharing(
            time_slicing=ReplicatedResources(resources=(ReplicatedResource(name=GPU, replicas=4),))
        )
        configs.append(Config(sharing=shared))
        assert daemon.reload("test")
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 32, timeout=scaled(5))
        assert_all(kubelet.devices(GPU), lambda d: "::" in d)
    finally:
        daemon.stop()


def test_invalid_reload_keeps_serving_last_good_config(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    state: dict[str, Config | None] = {"config": Config()}

    def load() -> Config:
        if state["config"] is None:
            raise ConfigError("flags.migStrategy must be one of none, single, mixed, got 'mix'")
        return state["config"]

    daemon = Daemon(simulated_options(plugin_dir, load_config=load))
    daemon.start()
    try:
        assert kubelet.wait_for_resources([GPU])
        state["config"] = None
        assert not daemon.reload("test")
        assert len(kubelet.devices(GPU)) == 8
        assert daemon.manager.served() == {GPU}
    finally:
        daemon.stop()


def test_mig_mixed_serves_one_resource_per_profile(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    daemon = start_daemon(plugin_dir, "a100-mig-mixed", lambda: Config(flags=Flags(mig_strategy="mixed")))
    try:
        names = [
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-2g.20gb",
            "nvidia.com/mig-3g.40gb",
        ]
        assert kubelet.wait_for_resources(names)
        assert len(kubelet.devices("nvidia.com/mig-1g.10gb")) == 9
        mig_id = sorted(kubelet.devices("nvidia.com/mig-3g.40gb"))[0]
        envs = kubelet.allocate("nvidia.com/mig-3g.40gb", [[mig_id]]).container_responses[0].envs
        assert envs["NVIDIA_VISIBLE_DEVICES"] == mig_id and mig_id.startswith("MIG-")
    finally:
        daemon.stop()


def test_missing_driver_fails_or_idles_per_fail_on_init_error(plugin_dir: Path) -> None:
    daemon = Daemon(DaemonOptions(plugin_dir=plugin_dir, load_config=Config, open_nvml=open_nvml))
    with pytest.raises(NvmlError, match="NVIDIA driver library not found"):
        daemon.start()
    daemon.stop()
    idle = Daemon(
        DaemonOptions(
            plugin_dir=plugin_dir,
            load_config=lambda: Config(flags=Flags(fail_on_init_error=False)),
            open_nvml=open_nvml,
        )
    )
    idle.start()
    assert idle.manager.served() == set()
    idle.stop()


def test_health_recovery_config_is_used(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    # The grace is how long kubelet can see the device Unhealthy: long enough for a busy machine's pauses.
    config = Config(health=HealthConfig(recovery=Recovery(enabled=True, grace_period_seconds=2.0)))
    daemon = start_daemon(plugin_dir, "t4-single", lambda: config)
    try:
        assert kubelet.wait_for_resources([GPU])
        uuid = gpu_uuids(daemon)[0]
        simulator(daemon).inject_xid(0, 48)
        assert kubelet.wait_for(lambda: kubelet.devices(GPU)[uuid].health == "Unhealthy", timeout=scaled(5))
        assert kubelet.wait_for(lambda: kubelet.devices(GPU)[uuid].health == "Healthy", timeout=scaled(10))
    finally:
        daemon.stop()


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "nvidia_device_plugin", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_run_command_serves_until_sigterm_and_cleans_up(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    proc = run_cli(
        "run", "--simulate", "dgx-a100", "--device-plugin-path", str(plugin_dir), "--metrics-address", ""
    )
    try:
        assert kubelet.wait_for_resources([GPU], timeout=scaled(30))
        proc.send_signal(signal.SIGHUP)  # forced reload: same config, still served
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
    assert proc.returncode == 0, output
    assert not (plugin_dir / "nvidia-gpu.sock").exists()
    assert "registered nvidia.com/gpu with kubelet" in output
    assert "config reloaded (SIGHUP)" in output


def test_sighup_with_a_config_that_cannot_be_loaded_is_a_rejected_reload_not_an_exit(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    config = tmp_path / "config.json"
    config.write_text('{"version": "v1"}')
    proc = run_cli(
        "run", "--simulate", "dgx-a100", "--device-plugin-path", str(plugin_dir), "--metrics-address", "",
        "--config-file", str(config),
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), name="daemon-output")
    try:
        reader.start()
        assert kubelet.wait_for_resources([GPU], timeout=scaled(30))
        config.write_text("[" * 700 + "]" * 700)  # nested 700 deep: a RecursionError for a naive loader
        proc.send_signal(signal.SIGHUP)
        assert kubelet.wait_for(lambda: any("nested more than" in line for line in lines))
        config.unlink()
        os.mkfifo(config)  # a FIFO: reading it would block the main thread, and SIGTERM with it
        proc.send_signal(signal.SIGHUP)
        assert kubelet.wait_for(lambda: any("named pipe (FIFO)" in line for line in lines))
        assert len(kubelet.devices(GPU)) == 8  # the last good config still serves
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=scaled(30))
    finally:
        proc.kill()
        if reader.is_alive():
            reader.join(timeout=scaled(30))
    assert proc.returncode == 0, "".join(lines)
    assert sum("rejected, still serving the previous config" in line for line in lines) >= 2


def test_env_var_selects_plugin_dir_and_node(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    proc = run_cli(
        "--metrics-address",
        "",
        env={"DEVICE_PLUGIN_PATH": str(plugin_dir), "NVDP_SIMULATE": "mixed-a100-h100"},
    )
    try:
        assert kubelet.wait_for_resources([GPU], timeout=scaled(30))
        assert len(kubelet.devices(GPU)) == 4
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
    assert proc.returncode == 0


def configmap_dir(root: Path, content: str, generation: int) -> None:
    """Write a ConfigMap volume the way kubelet does: a timestamped dir, `..data` swapped atomically."""
    data = root / f"..2026_12_02_00_00_{generation:02d}.000000001"
    data.mkdir()
    (data / "config.yaml").write_text(content)
    tmp_link = root / "..data_tmp"
    tmp_link.symlink_to(data.name)
    tmp_link.rename(root / "..data")
    if not (root / "config.yaml").is_symlink():
        (root / "config.yaml").symlink_to("..data/config.yaml")


def test_configmap_swap_reloads_live_and_bad_edits_keep_last_good(
    plugin_dir: Path, kubelet: KubeletStandIn, tmp_path: Path
) -> None:
    from nvidia_device_plugin.config.source import ConfigSource
    from nvidia_device_plugin.config.watch import ConfigWatcher

    mount = tmp_path / "config"
    mount.mkdir()
    shared = "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    shared += "      - {name: nvidia.com/gpu, replicas: %d}\n"
    configmap_dir(mount, shared % 2, 1)
    source = ConfigSource.from_file(mount / "config.yaml")
    daemon = Daemon(
        simulated_options(
            plugin_dir,
            load_config=lambda: source.load({}),
            watch=lambda on_change, defer: ConfigWatcher(source, on_change, defer_events=defer),
        )
    )
    daemon.start()
    try:
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16)
        configmap_dir(mount, shared % 5, 2)
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 40, timeout=scaled(5))
        configmap_dir(mount, shared % 0, 3)  # invalid: replicas must be >= 1
        assert kubelet.wait_for(lambda: reloads(daemon, "rejected") == 1, timeout=scaled(5))
        assert len(kubelet.devices(GPU)) == 40
        configmap_dir(mount, "version: v1\n", 4)  # back to whole GPUs
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8, timeout=scaled(5))
    finally:
        daemon.stop()


def test_config_file_event_watch_is_made_once_kubelet_has_the_resources(
    plugin_dir: Path, tmp_path: Path
) -> None:
    """watchdog's import and threads stay off the way to kubelet: while kubelet handles the first Register,
    the config watch has only its fingerprint; once kubelet has the resource registered it receives events
    (the poll interval is an hour, so only an event can bring the edit below)."""
    from nvidia_device_plugin.config.source import ConfigSource
    from nvidia_device_plugin.config.watch import ConfigWatcher

    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    source = ConfigSource.from_file(path)
    watchers: list[ConfigWatcher] = []
    at_register: list[bool] = []

    def make(on_change: Callable[[], None], defer: bool) -> ConfigWatcher:
        watchers.append(ConfigWatcher(source, on_change, poll_interval_seconds=3600, defer_events=defer))
        return watchers[-1]

    def watching_at_register(request: object) -> None:
        at_register.append(watchers[0].watching_events)

    with kubelet_standin(plugin_dir, reject=watching_at_register) as kubelet:
        daemon = Daemon(simulated_options(plugin_dir, load_config=lambda: source.load({}), watch=make))
        daemon.start()
        try:
            assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8)
            assert kubelet.wait_for(lambda: watchers[0].watching_events)
            path.write_text("version: v1\nsharing:\n  timeSlicing:\n    resources:\n" + _TWO_REPLICAS)
            assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 16, timeout=scaled(5))
        finally:
            daemon.stop()
    assert at_register[:1] == [False]


_TWO_REPLICAS = "      - {name: nvidia.com/gpu, replicas: 2}\n"


def reloads(daemon: Daemon, result: str) -> float:
    value = daemon.metrics.registry.get_sample_value(
        "nvidia_device_plugin_config_reloads_total", {"result": result}
    )
    return value or 0.0


def test_reload_replaces_renamed_resource_servers_and_sockets(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    from nvidia_device_plugin.config.v1 import ReplicatedResource, ReplicatedResources, Sharing

    renamed = Config(
        sharing=Sharing(
            time_slicing=ReplicatedResources(
                resources=(ReplicatedResource(name=GPU, replicas=2, rename="nvidia.com/gpu.shared"),)
            )
        )
    )
    configs = [renamed]
    daemon = start_daemon(plugin_dir, load_config=lambda: configs[-1])
    try:
        assert kubelet.wait_for_resources(["nvidia.com/gpu.shared"])
        assert (plugin_dir / "nvidia-gpu.shared.sock").exists()
        assert not (plugin_dir / "nvidia-gpu.sock").exists()
        configs.append(Config())
        assert daemon.reload("test")
        assert not (
            plugin_dir / "nvidia-gpu.shared.sock"
        ).exists()  # vanished resource: server and socket gone
        assert kubelet.wait_for(lambda: GPU in kubelet.resources() and len(kubelet.devices(GPU)) == 8)
        assert daemon.manager.served() == {GPU}
        assert kubelet.wait_for(daemon.manager.all_registered)
    finally:
        daemon.stop()


def test_pass_device_specs_works_on_a_simulated_mig_node(plugin_dir: Path, kubelet: KubeletStandIn) -> None:
    # The session owns the host paths: the simulator's proc and dev trees answer Allocate's device specs.
    from nvidia_device_plugin.config.v1 import PluginFlags

    config = Config(flags=Flags(mig_strategy="mixed", plugin=PluginFlags(pass_device_specs=True)))
    daemon = start_daemon(plugin_dir, "a100-mig-mixed", lambda: config)
    try:
        resource = "nvidia.com/mig-3g.40gb"
        assert kubelet.wait_for_resources([resource])
        mig_id = sorted(kubelet.devices(resource))[0]
        response = kubelet.allocate(resource, [[mig_id]]).container_responses[0]
        paths = [d.container_path for d in response.devices]
        assert "/dev/nvidiactl" in paths
        caps = [p for p in paths if p.startswith("/dev/nvidia-caps/nvidia-cap")]
        assert len(caps) == 2  # the GPU instance's and the compute instance's capability
    finally:
        daemon.stop()


def test_healthz_fails_while_a_resource_is_unregistered_and_passes_once_registered(plugin_dir: Path) -> None:
    import urllib.error
    import urllib.request

    daemon = start_daemon(plugin_dir, "t4-single", metrics_address="127.0.0.1:0")

    def healthz() -> tuple[int, str]:
        assert daemon.probes is not None
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{daemon.probes.port}/healthz", timeout=scaled(5)
            ) as r:
                return int(r.status), r.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    try:
        status, body = healthz()  # no kubelet: served, never registered
        assert status == 503 and "not registered with kubelet: nvidia.com/gpu" in body
        with kubelet_standin(plugin_dir) as kubelet:
            assert kubelet.wait_for(lambda: healthz() == (200, "ok\n"))
    finally:
        daemon.stop()
