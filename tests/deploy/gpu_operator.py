"""What the GPU Operator makes of its device-plugin DaemonSet asset for a ClusterPolicy (facts: data, rules).

The asset (data/gpu-operator/device-plugin-daemonset.yaml) is the Operator's starting point; `transform`
applies the changes its TransformDevicePlugin makes from `spec.devicePlugin`, as far as they reach our image:
- every container it fills (`nvidia-device-plugin`, `config-manager-init`, `config-manager`) gets the image
  `<repository>/<image>:<version>` (`@<version>` for a sha256: digest) and `imagePullPolicy`;
- `devicePlugin.env` entries are set on the plugin container (replacing one of the same name);
- with `devicePlugin.config.name`: the plugin container gets `CONFIG_FILE=/config/config.yaml`, an emptyDir
  `config` at /config and the ConfigMap (a volume named after it) at /available-configs; the pod shares its
  process namespace; both config-manager containers get `DEFAULT_CONFIG=<config.default>`,
  `FALLBACK_STRATEGIES=empty` and the same two mounts. Without it both config-manager containers are removed;
- `mig.strategy`: unset -> `NVIDIA_MIG_MONITOR_DEVICES=all`; set -> `MIG_STRATEGY=<strategy>`, and the
  monitor env unless it is `none`;
- `devicePlugin.args`, when given, replace the plugin container's args;
- with `cdi.enabled` (the default from Operator v25.10.0 on): `CDI_ENABLED=true` and the release's
  `DEVICE_LIST_STRATEGY`, `CDI_ANNOTATION_PREFIX` and hook path env (`RELEASES`), the hook path only while
  the Operator installs the toolkit (`toolkit.enabled`, default true) under `toolkit.installDir`.

Where each fact comes from (NVIDIA/gpu-operator):
- the asset: assets/state-device-plugin/0500_daemonset.yaml at 2410508a941819a329d9149f8278dc10a9ad9f32 (the
  data file is that file, byte for byte);
- OLDER: controllers/object_controls.go at 7cfefbf43258e9c5ff8b9a289d9957e8421b03a4, TransformDevicePlugin:
  `devicePlugin.env` set before MIG and CDI (which then win), CDI sets `envvar,cdi-annotations`,
  `nvidia.cdi.k8s.io/` and `NVIDIA_CTK_PATH=<installDir>/toolkit/nvidia-ctk`; CDI off unless enabled;
- CURRENT: controllers/object_controls.go, transformDevicePluginCtrForCDI and TransformDevicePlugin of the
  v25.10 line (and its object_controls_test.go "transform device plugin" cases): CDI sets
  `cdi-annotations,cdi-cri`, `cdi.k8s.io/` and `NVIDIA_CDI_HOOK_PATH=<installDir>/toolkit/nvidia-cdi-hook`,
  and `devicePlugin.env` is set last (it wins); CDI on by default from v25.10.0 (NVIDIA's GPU Operator
  documentation, "Container Device Interface (CDI) Support in the GPU Operator").
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).parent / "data" / "gpu-operator"
PLUGIN, INIT, SIDECAR = "nvidia-device-plugin", "config-manager-init", "config-manager"
DEFAULT_TOOLKIT_INSTALL_DIR = "/usr/local/nvidia"  # the ClusterPolicy's toolkit.installDir default


@dataclass(frozen=True)
class OperatorRelease:
    """What one line of Operator releases sets on the plugin container beyond the asset."""

    name: str
    cdi_by_default: bool  # cdi.enabled when the ClusterPolicy leaves it unset
    device_list_strategy: str  # DEVICE_LIST_STRATEGY under CDI
    annotation_prefix: str  # CDI_ANNOTATION_PREFIX under CDI
    hook_env: str  # the env naming the hook the specs must run
    hook_file: str  # under <toolkit.installDir>/toolkit/
    env_last: bool  # devicePlugin.env set after MIG and CDI (so it wins)


OLDER = OperatorRelease(
    "older", False, "envvar,cdi-annotations", "nvidia.cdi.k8s.io/", "NVIDIA_CTK_PATH", "nvidia-ctk", False
)
CURRENT = OperatorRelease(
    "current", True, "cdi-annotations,cdi-cri", "cdi.k8s.io/", "NVIDIA_CDI_HOOK_PATH", "nvidia-cdi-hook", True
)
RELEASES = (OLDER, CURRENT)


def hook_path(spec: dict[str, Any]) -> str:
    """Where the Operator's toolkit puts its hooks: <toolkit.installDir>/toolkit."""
    install_dir = (spec.get("toolkit") or {}).get("installDir") or DEFAULT_TOOLKIT_INSTALL_DIR
    return f"{install_dir}/toolkit"


def asset() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load((DATA / "device-plugin-daemonset.yaml").read_text())
    return document


def entrypoint_script() -> str:
    config_map = yaml.safe_load((DATA / "entrypoint-configmap.yaml").read_text())
    script: str = config_map["data"]["entrypoint.sh"]
    return script


def image_path(device_plugin: dict[str, Any]) -> str:
    """The Operator's ImagePath: repository/image:version, or repository/image@version for a digest."""
    separator = "@" if str(device_plugin["version"]).startswith("sha256:") else ":"
    return f"{device_plugin['repository']}/{device_plugin['image']}{separator}{device_plugin['version']}"


def _set_env(container: dict[str, Any], name: str, value: str) -> None:
    for entry in container.setdefault("env", []):
        if entry["name"] == name:
            entry.clear()
            entry.update({"name": name, "value": value})
            return
    container["env"].append({"name": name, "value": value})


def _config_mounts(container: dict[str, Any], config_name: str) -> None:
    container.setdefault("volumeMounts", []).extend(
        [{"name": "config", "mountPath": "/config"}, {"name": config_name, "mountPath": "/available-configs"}]
    )


def transform(spec: dict[str, Any], release: OperatorRelease = CURRENT) -> dict[str, Any]:
    """The DaemonSet Operator `release` applies for ClusterPolicy `spec`."""
    daemonset = copy.deepcopy(asset())
    pod = daemonset["spec"]["template"]["spec"]
    device_plugin = spec["devicePlugin"]
    ours = [c for c in pod["initContainers"] + pod["containers"] if c["name"] in (PLUGIN, INIT, SIDECAR)]
    for container in ours:
        container["image"] = image_path(device_plugin)
        container["imagePullPolicy"] = device_plugin.get("imagePullPolicy", "IfNotPresent")
    [plugin] = [c for c in pod["containers"] if c["name"] == PLUGIN]
    if device_plugin.get("args"):
        plugin["args"] = list(device_plugin["args"])
    if not release.env_last:
        _user_env(plugin, device_plugin)
    _config(pod, ours, plugin, device_plugin)
    strategy = (spec.get("mig") or {}).get("strategy", "")
    if strategy:
        _set_env(plugin, "MIG_STRATEGY", strategy)
    if strategy != "none":
        _set_env(plugin, "NVIDIA_MIG_MONITOR_DEVICES", "all")
    if (spec.get("cdi") or {}).get("enabled", release.cdi_by_default):
        _cdi(plugin, spec, release)
    if release.env_last:
        _user_env(plugin, device_plugin)
    return daemonset


def _user_env(plugin: dict[str, Any], device_plugin: dict[str, Any]) -> None:
    for entry in device_plugin.get("env", []):
        _set_env(plugin, entry["name"], entry["value"])


def _cdi(plugin: dict[str, Any], spec: dict[str, Any], release: OperatorRelease) -> None:
    _set_env(plugin, "CDI_ENABLED", "true")
    _set_env(plugin, "DEVICE_LIST_STRATEGY", release.device_list_strategy)
    _set_env(plugin, "CDI_ANNOTATION_PREFIX", release.annotation_prefix)
    if (spec.get("toolkit") or {}).get("enabled", True):
        _set_env(plugin, release.hook_env, f"{hook_path(spec)}/{release.hook_file}")


def _config(
    pod: dict[str, Any], ours: list[dict[str, Any]], plugin: dict[str, Any], device_plugin: dict[str, Any]
) -> None:
    """handleDevicePluginConfig: the config-manager containers and mounts, or no config-manager."""
    config = device_plugin.get("config") or {}
    if config.get("name"):
        _set_env(plugin, "CONFIG_FILE", "/config/config.yaml")
        _config_mounts(plugin, config["name"])
        pod["shareProcessNamespace"] = True
        pod["volumes"] += [
            {"name": config["name"], "configMap": {"name": config["name"]}},
            {"name": "config", "emptyDir": {}},
        ]
        for container in (c for c in ours if c["name"] in (INIT, SIDECAR)):
            _set_env(container, "DEFAULT_CONFIG", config.get("default", ""))
            _set_env(container, "FALLBACK_STRATEGIES", "empty")
            _config_mounts(container, config["name"])
    else:
        pod["initContainers"] = [c for c in pod["initContainers"] if c["name"] != INIT]
        pod["containers"] = [c for c in pod["containers"] if c["name"] != SIDECAR]


def container(daemonset: dict[str, Any], name: str) -> dict[str, Any]:
    pod = daemonset["spec"]["template"]["spec"]
    [found] = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name]
    return found


def env_of(container: dict[str, Any], node_name: str) -> dict[str, str]:
    """The container's environment as the kubelet sets it (fieldRef spec.nodeName resolved)."""
    env = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif entry["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName":
            env[entry["name"]] = node_name
    return env


def cluster_policy_in(markdown: Path) -> dict[str, Any]:
    """The first ```yaml block of `markdown` that is a ClusterPolicy."""
    for block in re.findall(r"```yaml\n(.*?)```", markdown.read_text(), re.DOTALL):
        document = yaml.safe_load(block)
        if isinstance(document, dict) and document.get("kind") == "ClusterPolicy":
            return document
    raise AssertionError(f"{markdown} shows no ClusterPolicy in a ```yaml block")
