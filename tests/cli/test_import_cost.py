"""Each command imports only what it uses: read in a fresh interpreter, after the command ran for real.

`plan`, `check-config` and `labels` read and print: no gRPC server, no Prometheus client, no kubernetes
client, no file watching. `run` serves kubelet (gRPC) but imports the kubernetes client only when
`--node-config-label` asks it to follow a node label, the Prometheus client only when it serves metrics, and
the DRA mode's modules only when the config turns `dra.enabled` on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.programs import output_of_a_served_run
from support.waiting import scaled

# Runs the command through the real entry point, then reports which modules ended up loaded.
_REPORT_MODULES = """
import atexit, json, sys
atexit.register(lambda: print("MODULES " + json.dumps(sorted(sys.modules)), flush=True))
from nvidia_device_plugin.cli.main import main
sys.exit(main(sys.argv[1:]))
"""

NOT_FOR_READING_COMMANDS = (
    "kubernetes",
    "prometheus_client",
    "grpc",
    "watchdog",
    "nvidia_device_plugin.daemons.run",
    "nvidia_device_plugin.telemetry.metrics",
    "nvidia_device_plugin.plugin.server",
    "nvidia_device_plugin.configmanager.nodewatch",
)


# What `run` with metrics off (`--metrics-address ""`) and DRA off (the default config) never imports. Of the
# dra package it loads only the package, `dra.options` (run's DRA flags) and `dra.side` (the object the
# Daemon owns).
NOT_FOR_RUN_WITHOUT_METRICS_OR_DRA = (
    "kubernetes",
    "prometheus_client",
    "http.server",
    "nvidia_device_plugin.telemetry.metrics",
    "nvidia_device_plugin.telemetry.probes",
    "nvidia_device_plugin.configmanager.inprocess",
    "nvidia_device_plugin.configmanager.nodewatch",
)
# What a plain `run` (no CDI strategy, --labels-file, config file, MIG device or --simulate-events) never
# imports (issue 28's start-up target): the CDI node scan, the label pipeline, the config-file watch,
# decimal (MIG memory sizes), the simulated events feeder, the other commands' modules, difflib (the hints
# of usage errors), hashlib (OpenSSL's `_hashlib`: the simulator's UUIDs are made without it), uuid and the
# platform module it loads (base/uuids.py writes the package's UUIDs), PyYAML (no config file; the
# simulator's presets are JSON), the MPS readiness watcher (no MPS plan), the CDI spec publisher (no CDI
# strategy: nor is kubelet's checkpoint read) and the child-process runner (nvidia-smi sets time-slices).
NOT_FOR_A_PLAIN_RUN = (
    "nvidia_device_plugin.sharing.readiness",
    "nvidia_device_plugin.cdi.writer",
    "nvidia_device_plugin.cdi.retention",
    "nvidia_device_plugin.cdi.version",
    "nvidia_device_plugin.base.children",
    "nvidia_device_plugin.cdi.spec",
    "nvidia_device_plugin.cdi.edits",
    "nvidia_device_plugin.cdi.scan",
    "nvidia_device_plugin.cdi.graphics",
    "nvidia_device_plugin.labels.node",
    "nvidia_device_plugin.labels.gfd",
    "nvidia_device_plugin.labels.writer",
    "nvidia_device_plugin.config.watch",
    "decimal",
    "nvidia_device_plugin.nvml.sim.events",
    "nvidia_device_plugin.cli.demo",
    "nvidia_device_plugin.cli.plan",
    "nvidia_device_plugin.cli.check_config",
    "nvidia_device_plugin.cli.mps_control",
    "hashlib",
    "_hashlib",
    "difflib",
    "uuid",
    "platform",
    "yaml",
    "_yaml",
)
DRA_MODULES_RUN_MAY_LOAD = (
    "nvidia_device_plugin.dra",
    "nvidia_device_plugin.dra.options",
    "nvidia_device_plugin.dra.side",
)


def _modules(output: str) -> set[str]:
    line = next(line for line in output.splitlines() if line.startswith("MODULES "))
    return set(json.loads(line.removeprefix("MODULES ")))


def _run_command(*argv: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _REPORT_MODULES, *argv], capture_output=True, text=True, timeout=scaled(60)
    )
    assert proc.returncode == 0, proc.stderr
    return _modules(proc.stdout)


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 2\n"
    )
    return path


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(("plan", "--simulate", "t4-single"), id="plan"),
        pytest.param(("plan", "--simulate", "t4-single", "--output", "json"), id="plan-json"),
        pytest.param(("labels", "--simulate", "t4-single", "--no-timestamp"), id="labels"),
    ],
)
def test_reading_commands_import_no_server_metrics_or_kubernetes(argv: tuple[str, ...]) -> None:
    loaded = _run_command(*argv)
    assert "nvidia_device_plugin.snapshot" in loaded  # it did read the node
    assert sorted(loaded & set(NOT_FOR_READING_COMMANDS)) == []


def test_check_config_imports_no_server_metrics_or_kubernetes(config_file: Path) -> None:
    loaded = _run_command("check-config", str(config_file))
    assert "nvidia_device_plugin.config.loader" in loaded
    assert sorted(loaded & set(NOT_FOR_READING_COMMANDS)) == []


def _modules_of_a_served_run(argv: list[str], kubelet: KubeletStandIn) -> set[str]:
    """The modules `argv` (a `run`) had loaded once it served kubelet and stopped on SIGTERM."""
    return _modules(output_of_a_served_run(_REPORT_MODULES, argv, kubelet, [GPU]))


def test_run_without_a_node_label_metrics_or_dra_imports_none_of_them(
    plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    argv = ["run", "--simulate", "t4-single", "--device-plugin-path", str(plugin_dir)]
    argv += ["--metrics-address", ""]
    loaded = _modules_of_a_served_run(argv, kubelet)
    assert {"grpc", "nvidia_device_plugin.daemons.run"} <= loaded  # it served
    assert sorted(loaded & set(NOT_FOR_RUN_WITHOUT_METRICS_OR_DRA)) == []
    assert sorted(loaded & set(NOT_FOR_A_PLAIN_RUN)) == []
    dra = {m for m in loaded if m == "nvidia_device_plugin.dra" or m.startswith("nvidia_device_plugin.dra.")}
    assert sorted(dra - set(DRA_MODULES_RUN_MAY_LOAD)) == []


def test_run_with_a_watched_config_file_loads_no_hashlib(
    plugin_dir: Path, kubelet: KubeletStandIn, config_file: Path
) -> None:
    # OpenSSL's `_hashlib` is about 0.5 MB of RSS (issue 28): the file's fingerprint uses CPython's SHA-256.
    argv = ["run", "--simulate", "t4-single", "--device-plugin-path", str(plugin_dir)]
    argv += ["--metrics-address", "", "--config-file", str(config_file)]
    loaded = _modules_of_a_served_run(argv, kubelet)
    assert "nvidia_device_plugin.config.watch" in loaded  # it did watch the file
    assert sorted(loaded & {"hashlib", "_hashlib"}) == []


# The run command's modules and its config from the flags and env alone (no --config-file, as NVIDIA's
# default deployment starts the plugin); what it loads before NVML (a served run on a preset is above).
_RUN_CONFIG_MODULES = """
import json, sys
from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.cli.common import config_loader
import nvidia_device_plugin.daemons.run
args = build_parser({}).parse_args(["run", "--pass-device-specs"])
assert config_loader(args, {"MIG_STRATEGY": "single"})().flags.plugin.pass_device_specs
print("MODULES " + json.dumps(sorted(sys.modules)))
"""


def test_run_without_a_config_file_loads_no_yaml() -> None:
    # PyYAML and libyaml: about 12 ms and 0.7 MB of a start (issue 28), for a file that is not there.
    proc = subprocess.run(
        [sys.executable, "-c", _RUN_CONFIG_MODULES], capture_output=True, text=True, timeout=scaled(60)
    )
    assert proc.returncode == 0, proc.stderr
    loaded = _modules(proc.stdout)
    assert "nvidia_device_plugin.daemons.run" in loaded
    assert sorted(m for m in loaded if m == "yaml" or m.startswith("yaml.")) == []
