"""The GPU Operator's contract: its device-plugin DaemonSet (data/gpu-operator/, transformed as
gpu_operator.py says) runs this image's entry points with exactly the Operator's env and args.

The processes get the env the Operator gives each container, plus only what a pod has and a test process has
not: the volumes (every path the Operator mounts is a directory under tmp_path, and env values naming a mount
path are moved with it), kubelet's device-plugin directory (DEVICE_PLUGIN_PATH, the same directory under
tmp_path), no GPU (NVDP_SIMULATE=dgx-a100), a free metrics port, and the API server (a stand-in, named by
config-manager's --kubeconfig flag: the Operator's KUBECONFIG="" means the pod's service account). The
plugin is started by the Operator's own entrypoint script under /bin/sh. The pod's containers share a process
namespace as the Operator's pod does (shareProcessNamespace), here a PID namespace of their own (unshare), so
the sidecar's SIGHUP reaches this pod's plugin and nothing else on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gpu_operator import (
    CURRENT,
    INIT,
    OLDER,
    PLUGIN,
    RELEASES,
    SIDECAR,
    OperatorRelease,
    cluster_policy_in,
    container,
    entrypoint_script,
    env_of,
    transform,
)

from nvidia_device_plugin import __version__
from nvidia_device_plugin.cli.main import build_parser, with_command
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.configmanager.settings import parse_settings
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.sharing.readiness import status_path
from nvidia_device_plugin.snapshot import build_snapshot

from support.checks import assert_all
from support.fake_apiserver import LABEL, NODE, FakeApiServer, write_kubeconfig
from support.kubelet_standin import kubelet_standin
from support.namespaces import pid_namespace_prefix
from support.programs import CHILD_PATH
from support.waiting import scaled, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
DOCS = ROOT / "docs" / "operations.md"
CHART_VALUES = ROOT / "deployments" / "helm" / "nvidia-device-plugin" / "values.yaml"
# The mounts of the Operator's pod that the processes read or write.
MOUNTS = ("/available-configs", "/config", "/run/nvidia/validations", "/run/nvidia/mps")
# What the config-manager sidecar logs when its SIGHUP found this pod's plugin (SEND_SIGNAL=true).
SENT_SIGHUP = "sent signal 1 to nvidia-device-plugin"
# What the Operator's validator writes for a driver installed on the host; the entrypoint sources it.
DRIVER_READY = "".join(
    f"{line}\n"
    for line in (
        "IS_HOST_DRIVER=true",
        "NVIDIA_DRIVER_ROOT=/",
        "DRIVER_ROOT_CTR_PATH=/host",
        "NVIDIA_DEV_ROOT=/",
        "DEV_ROOT_CTR_PATH=/host",
    )
)


def _policy() -> dict[str, Any]:
    spec: dict[str, Any] = cluster_policy_in(DOCS)["spec"]
    return spec


def _remap(env: dict[str, str], root: Path) -> dict[str, str]:
    """Env values naming a mount path, moved under `root` with the mount."""
    moved = {}
    for name, value in env.items():
        for mount in MOUNTS:
            if value == mount or value.startswith(mount + "/"):
                value = str(root) + value
                break
        moved[name] = value
    return moved


def _process_env(container_env: dict[str, str]) -> dict[str, str]:
    # PATH as the image has it (the venv's bin first); nothing else of the test's environment leaks in.
    # PYTHONPATH: test-only packages hidden, as the image has none (support/programs.py).
    return {
        "PATH": f"{BIN}:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "PYTHONPATH": str(CHILD_PATH),
        **container_env,
    }


# ---- settings: the Operator's values and NVIDIA's flag forms -----------------------------------------------


def test_the_operators_empty_signal_and_process_mean_the_defaults() -> None:
    daemonset = transform(_policy())
    init = parse_settings([], env_of(container(daemonset, INIT), NODE))
    assert (init.oneshot, init.send_signal) == (True, False)
    assert init.signal == signal.SIGHUP and init.process_to_signal == "nvidia-device-plugin"
    assert init.kubeconfig == "" and init.default_config == _policy()["devicePlugin"]["config"]["default"]
    sidecar = parse_settings([], env_of(container(daemonset, SIDECAR), NODE))
    assert (sidecar.oneshot, sidecar.send_signal, sidecar.signal) == (False, True, signal.SIGHUP)
    assert [s.value for s in sidecar.fallback_strategies] == ["empty"]


def test_nvidias_flag_forms_bare_switches_and_kubeconfig() -> None:
    required = {"NODE_NAME": NODE, "CONFIG_FILE_SRCDIR": "/available-configs", "CONFIG_FILE_DST": "/config/c"}
    settings = parse_settings(["--oneshot", "--kubeconfig", "/etc/k.yaml", "--send-signal"], required)
    assert (settings.oneshot, settings.send_signal, settings.kubeconfig) == (True, True, "/etc/k.yaml")
    assert parse_settings(["--oneshot=false"], {**required, "ONESHOT": "true"}).oneshot is False
    assert parse_settings(["--oneshot", "false"], required).oneshot is False
    assert parse_settings([], {**required, "KUBECONFIG": "/k"}).kubeconfig == "/k"


# ---- the ClusterPolicy in docs/operations.md ------------------------------------------------------------


def test_the_documented_cluster_policy_runs_this_image_in_every_container() -> None:
    values = yaml.safe_load(CHART_VALUES.read_text())
    expected = f"{values['image']['repository']}:{__version__}"
    daemonset = transform(_policy())
    for name in (PLUGIN, INIT, SIDECAR):
        assert container(daemonset, name)["image"] == expected, name
    assert _policy()["devicePlugin"]["config"]["name"], "the documented policy sets a config ConfigMap"


def test_without_a_config_the_operator_runs_the_plugin_alone() -> None:
    spec = _policy()
    spec["devicePlugin"] = {k: v for k, v in spec["devicePlugin"].items() if k != "config"}
    pod = transform(spec)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == [PLUGIN]
    assert [c["name"] for c in pod["initContainers"]] == ["toolkit-validation"]


# ---- the Operator's releases: CDI off (older) and on by default (v25.10.0 on) --------------------------

HOOKS = "/usr/local/nvidia/toolkit"  # the default toolkit.installDir + /toolkit


def _plugin_config(spec: dict[str, Any], release: OperatorRelease) -> tuple[dict[str, str], Config]:
    """The plugin container's env under `release` and the config this plugin resolves from it (the config
    file left out: its flags would not change what the env sets)."""
    env = {
        k: v
        for k, v in env_of(container(transform(spec, release), PLUGIN), NODE).items()
        if k != "CONFIG_FILE"
    }
    return env, resolve_config(build_parser(env).parse_args(["run"]), env)


def test_the_current_operator_turns_cdi_on_and_names_the_standalone_hook() -> None:
    env, config = _plugin_config(_policy(), CURRENT)
    assert {k: env[k] for k in ("CDI_ENABLED", "DEVICE_LIST_STRATEGY", "CDI_ANNOTATION_PREFIX")} == {
        "CDI_ENABLED": "true",
        "DEVICE_LIST_STRATEGY": "cdi-annotations,cdi-cri",
        "CDI_ANNOTATION_PREFIX": "cdi.k8s.io/",
    }
    assert env["NVIDIA_CDI_HOOK_PATH"] == f"{HOOKS}/nvidia-cdi-hook" and "NVIDIA_CTK_PATH" not in env
    plugin = config.flags.plugin
    assert plugin.device_list_strategy == ("cdi-annotations", "cdi-cri")
    assert plugin.cdi_annotation_prefix == "cdi.k8s.io/"
    assert plugin.nvidia_ctk_path == f"{HOOKS}/nvidia-cdi-hook"


def test_the_older_operator_serves_envvar_unless_cdi_is_enabled_and_then_names_nvidia_ctk() -> None:
    env, config = _plugin_config(_policy(), OLDER)
    assert env["DEVICE_LIST_STRATEGY"] == "envvar" and "CDI_ENABLED" not in env
    spec = {**_policy(), "cdi": {"enabled": True}, "toolkit": {"installDir": "/opt/nvidia"}}
    env, config = _plugin_config(spec, OLDER)
    assert env["DEVICE_LIST_STRATEGY"] == "envvar,cdi-annotations"
    assert env["CDI_ANNOTATION_PREFIX"] == "nvidia.cdi.k8s.io/"
    assert env["NVIDIA_CTK_PATH"] == "/opt/nvidia/toolkit/nvidia-ctk" and "NVIDIA_CDI_HOOK_PATH" not in env
    assert config.flags.plugin.nvidia_ctk_path == "/opt/nvidia/toolkit/nvidia-ctk"
    assert config.flags.plugin.device_list_strategy == ("envvar", "cdi-annotations")


def test_without_the_operators_toolkit_no_hook_path_is_set() -> None:
    env, _ = _plugin_config({**_policy(), "toolkit": {"enabled": False}}, CURRENT)
    assert "NVIDIA_CDI_HOOK_PATH" not in env and env["CDI_ENABLED"] == "true"


@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
def test_a_users_env_wins_only_in_the_current_operator(release: OperatorRelease) -> None:
    spec = {**_policy(), "cdi": {"enabled": True}}
    spec["devicePlugin"] = {
        **spec["devicePlugin"],
        "env": [{"name": "DEVICE_LIST_STRATEGY", "value": "envvar"}],
    }
    env, _ = _plugin_config(spec, release)
    assert env["DEVICE_LIST_STRATEGY"] == ("envvar" if release.env_last else release.device_list_strategy)


def test_the_operators_args_replace_the_entrypoints_args() -> None:
    """devicePlugin.args replace the asset's args (`/bin/entrypoint.sh`), and so they are what `/bin/sh -c`
    runs: a command line for this image's entry point, as for NVIDIA's."""
    argv = ["nvidia-device-plugin --fail-on-init-error=false"]
    spec = {**_policy(), "devicePlugin": {**_policy()["devicePlugin"], "args": argv}}
    for release in RELEASES:
        plugin = container(transform(spec, release), PLUGIN)
        assert (plugin["command"], plugin["args"]) == (["/bin/sh", "-c"], argv)
    parser = build_parser({})
    args = parser.parse_args(with_command(argv[0].split()[1:], parser))  # bare flags mean `run`
    assert resolve_config(args, {}).flags.fail_on_init_error is False


@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
def test_the_cdi_spec_runs_the_hook_the_operator_names(release: OperatorRelease) -> None:
    """Every hook of the spec is the Operator's file, run the way that file takes hook names."""
    _, config = _plugin_config({**_policy(), "cdi": {"enabled": True}}, release)
    session = open_nvml("t4-single")
    try:
        snapshot = build_snapshot(session, config)
    finally:
        session.close()
    assert snapshot.cdi is not None and snapshot.cdi.problem is None, snapshot.cdi
    [spec] = [s.document for s in snapshot.cdi.specs if s.kind.endswith("/gpu")]
    hooks = [
        *spec["containerEdits"]["hooks"],
        *(h for d in spec["devices"] for h in d["containerEdits"]["hooks"]),
    ]
    assert {h["path"] for h in hooks} == {f"{HOOKS}/{release.hook_file}"}
    runs = ["nvidia-ctk", "hook"] if release.hook_file == "nvidia-ctk" else ["nvidia-cdi-hook"]
    assert_all(hooks, lambda h: h["args"][: len(runs)] == runs, [h["args"][:2] for h in hooks])


# ---- the processes ------------------------------------------------------------------------------------


def _available_configs(root: Path) -> Path:
    directory = root / "available-configs"
    directory.mkdir()
    (directory / "default").write_text("version: v1\nflags:\n  migStrategy: none\n")
    shutil.copy(ROOT / "configs" / "time-slicing.yaml", directory / "time-slicing")
    (root / "config").mkdir()
    return directory


def _config_manager(name: str, root: Path, kubeconfig: Path) -> tuple[list[str], dict[str, str]]:
    """argv and env of the Operator's config-manager container `name` (the one flag added: --kubeconfig)."""
    spec = container(transform(_policy()), name)
    assert spec["command"] == ["config-manager"] and "args" not in spec
    env = _remap(env_of(spec, NODE), root)
    return [*spec["command"], f"--kubeconfig={kubeconfig}"], _process_env(env)


@pytest.mark.parametrize(("label", "chosen"), [("time-slicing", "time-slicing"), (None, "default")])
def test_config_manager_init_links_the_config_with_the_operators_env(
    tmp_path: Path, label: str | None, chosen: str
) -> None:
    configs = _available_configs(tmp_path)
    with FakeApiServer({LABEL: label} if label else {}) as api:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        argv, env = _config_manager(INIT, tmp_path, kubeconfig)
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=scaled(60), check=False)
    assert done.returncode == 0, done.stderr
    assert os.readlink(tmp_path / "config" / "config.yaml") == str(configs / chosen)


@pytest.fixture
def pid_namespace() -> Iterator[list[str]]:
    """The prefix that runs a command as PID 1 of a new PID namespace with its own /proc."""
    yield pid_namespace_prefix("for the Operator's pod")


def _pod_script(root: Path, kubeconfig: Path, release: OperatorRelease) -> tuple[str, dict[str, str]]:
    """A shell script standing in for the pod: init container, then sidecar and plugin side by side."""
    daemonset = transform(_policy(), release)
    plugin = container(daemonset, PLUGIN)
    assert plugin["command"] == ["/bin/sh", "-c"] and plugin["args"] == ["/bin/entrypoint.sh"]
    (root / "run" / "nvidia" / "validations").mkdir(parents=True)
    (root / "run" / "nvidia" / "validations" / "driver-ready").write_text(DRIVER_READY)
    entrypoint = root / "entrypoint.sh"
    entrypoint.write_text(
        entrypoint_script().replace("/run/nvidia/validations", f"{root}/run/nvidia/validations")
    )
    entrypoint.chmod(0o700)
    init_argv, init_env = _config_manager(INIT, root, kubeconfig)
    sidecar_argv, sidecar_env = _config_manager(SIDECAR, root, kubeconfig)
    plugin_env = _remap(env_of(plugin, NODE), root)
    exports = {"INIT": init_env, "SIDECAR": sidecar_env, "PLUGIN": plugin_env}
    lines = ["set -e"]
    for name, env in exports.items():
        assignments = " ".join(f"{k}={_quote(v)}" for k, v in env.items())
        lines.append(f"{name}_ENV='{assignments}'")
    lines += [
        f"env -i $INIT_ENV {' '.join(init_argv)}",
        f"env -i $SIDECAR_ENV {' '.join(sidecar_argv)} &",
        f"exec env -i $PLUGIN_ENV {' '.join(plugin['command'])} {entrypoint}",
    ]
    return "\n".join(lines) + "\n", plugin_env


def _quote(value: str) -> str:
    assert "'" not in value and " " not in value, f"{value!r} needs quoting the pod script does not do"
    return value


def _assert_served_as_the_release_asks(answer: Any, release: OperatorRelease) -> None:
    """The Allocate answer under the release's DEVICE_LIST_STRATEGY (its default cdi.enabled)."""
    if not release.cdi_by_default:
        assert answer.envs["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")  # DEVICE_LIST_STRATEGY=envvar
        assert any(d.host_path == "/dev/nvidiactl" for d in answer.devices)  # PASS_DEVICE_SPECS=true
        return
    # cdi-annotations,cdi-cri: only CDI names; as NVIDIA's getAllocateResponse, no envvar and no device
    # specs when every strategy is a CDI one (the spec carries the nodes), PASS_DEVICE_SPECS=true or not.
    assert "NVIDIA_VISIBLE_DEVICES" not in answer.envs and not answer.devices
    cri = [d.name for d in answer.cdi_devices]
    assert len(cri) == 2 and all(n.startswith("k8s.device-plugin.nvidia.com/gpu=GPU-") for n in cri), cri
    [(key, value)] = answer.annotations.items()
    assert key.startswith(release.annotation_prefix) and value.split(",") == cri, (key, value)


@pytest.mark.parametrize("release", RELEASES, ids=[r.name for r in RELEASES])
def test_the_operators_pod_serves_and_follows_the_node_label(
    tmp_path: Path, plugin_dir: Path, pid_namespace: list[str], release: OperatorRelease
) -> None:
    configs = _available_configs(tmp_path)
    (tmp_path / "run" / "nvidia" / "mps").mkdir(parents=True)
    with FakeApiServer({LABEL: "time-slicing"}) as api, kubelet_standin(plugin_dir) as kubelet:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", api.url)
        script, plugin_env = _pod_script(tmp_path, kubeconfig, release)
        assert plugin_env["CONFIG_FILE"] == f"{tmp_path}/config/config.yaml"
        extra = f"NVDP_SIMULATE=dgx-a100 NVDP_METRICS_ADDRESS=127.0.0.1:0 DEVICE_PLUGIN_PATH={plugin_dir} "
        script = script.replace("PLUGIN_ENV='", f"PLUGIN_ENV='PATH={BIN}:/usr/bin:/bin {extra}")
        log = (tmp_path / "pod.log").open("w")
        pod = subprocess.Popen(
            [*pid_namespace, "/bin/sh", "-c", script], stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_for(
                lambda: len(kubelet.devices("nvidia.com/gpu")) == 32, "the time-slicing config (8 x 4)", 60
            )
            assert os.readlink(tmp_path / "config" / "config.yaml") == str(configs / "time-slicing")
            devices = kubelet.devices("nvidia.com/gpu")
            assert {d.health for d in devices.values()} == {"Healthy"}
            _, answer = kubelet.admit("nvidia.com/gpu", 2)
            _assert_served_as_the_release_asks(answer, release)
            api.set_label("default")
            wait_for(
                lambda: len(kubelet.devices("nvidia.com/gpu")) == 8, "the label's new config (8 GPUs)", 60
            )
            # The plugin also follows the link itself, so its reload can come before the sidecar's line.
            wait_for(lambda: SENT_SIGHUP in (tmp_path / "pod.log").read_text(), "the sidecar's SIGHUP")
        finally:
            pod.kill()  # unshare ignores SIGTERM while it waits; --kill-child then ends the whole namespace
            pod.wait(timeout=scaled(30))
            log.close()
    output = (tmp_path / "pod.log").read_text()
    assert "Starting nvidia-device-plugin" in output, output
    assert "IS_HOST_DRIVER=true" in output, "the entrypoint prints the driver-ready file it sources"
    # The sidecar's SIGHUP (SEND_SIGNAL=true, PROCESS_TO_SIGNAL=nvidia-device-plugin) found this pod's plugin.
    assert SENT_SIGHUP in output, output


# ---- MPS through the Operator: unsupported, and why (docs/operations.md) ----------------------------------


def test_the_operators_plugin_pod_does_not_mount_the_mps_root_where_this_plugin_reads_readiness() -> None:
    """The plugin reads each MPS daemon's readiness under MPS_ROOT in its own container; the Operator sets
    MPS_ROOT to the host path but mounts that host directory at /mps. Should the Operator ever mount it at
    the host path, this fails: MPS through the Operator may then become possible."""
    plugin = container(transform(_policy()), PLUGIN)
    # MPS_ROOT beats any config file's flags.mpsRoot (env > file), so the file is left out here.
    env = {k: v for k, v in env_of(plugin, NODE).items() if k != "CONFIG_FILE"}
    config = resolve_config(build_parser(env).parse_args(["run"]), env)
    readiness = status_path(config.flags.mps_root, "nvidia.com/gpu", "GPU-0")
    volumes = {v["name"]: v for v in transform(_policy())["spec"]["template"]["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in plugin["volumeMounts"]}
    assert config.flags.mps_root == "/run/nvidia/mps"
    assert volumes[mounts["/mps"]]["hostPath"]["path"] == config.flags.mps_root
    covering = [path for path in mounts if readiness.startswith(path.rstrip("/") + "/")]
    assert covering == [], f"{readiness} is under the mounts {covering}"
    assert "MPS through the Operator is not supported" in DOCS.read_text()
