"""`demo` on every preset with every example config: each ends with a clear result, never a traceback.

In process (the command's own handler, the real daemon, the kubelet stand-in over unix sockets), so the 66
runs take seconds. What the config needs runs too: MPS gets the supervisor of `mps-control-daemon` with the
demo's stand-in control program.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.main import build_parser, with_command
from nvidia_device_plugin.nvml.sim.node import preset_names

from support.waiting import eventually

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EXAMPLES = sorted(p.name for p in CONFIGS.glob("*.yaml"))
# The only runs that advertise nothing: MIG single on nodes whose MIG layout breaks it (each GPU named).
# (node, config) -> the MIG strategy every GPU breaks there. a100-mig-dynamic's GPUs are in MIG mode without
# MIG devices (dynamic MIG makes them): neither MIG strategy has anything to advertise.
NOTHING_ADVERTISED = {
    ("b200", "mig-single.yaml"): "single",
    ("h100-nvl", "mig-single.yaml"): "single",
    ("a100-mig-dynamic", "mig-mixed.yaml"): "mixed",
    ("a100-mig-dynamic", "mig-single.yaml"): "single",
    ("a100-mig-dynamic", "per-model-renames.yaml"): "mixed",
}


def demo(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    parser = build_parser({})
    args = parser.parse_args(with_command(["demo", "--log-level", "error", *argv], parser))
    rc = args.handler(args, {})
    return rc, capsys.readouterr().out


def demo_processes(output: str) -> list[str]:
    """Processes still running from the demo's temporary tree (the stand-in MPS servers)."""
    match = re.search(r"Kubelet stand-in in (\S+)/kubelet", output)
    assert match, output
    root = match.group(1)
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if root in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_there_are_thirteen_presets_and_six_example_configs() -> None:
    assert (len(preset_names()), len(EXAMPLES)) == (13, 6)


@pytest.mark.parametrize("config", EXAMPLES)
@pytest.mark.parametrize("node", preset_names())
def test_every_preset_with_every_example_config_ends_clearly(
    capsys: pytest.CaptureFixture[str], node: str, config: str
) -> None:
    rc, output = demo(capsys, "--simulate", node, "--config-file", str(CONFIGS / config))
    assert rc == 0, output
    assert output.startswith(f"Simulated node '{node}': ")
    if (node, config) in NOTHING_ADVERTISED:
        strategy = NOTHING_ADVERTISED[(node, config)]
        assert f"No resources advertised: every GPU breaks flags.migStrategy={strategy}" in output
        return
    assert re.search(
        r"\nAdmitted a pod asking for nvidia\.com/[a-z0-9.-]+: [12]\n  preferred allocation: ", output
    )
    assert "  env NVIDIA_VISIBLE_DEVICES=" in output


def test_mps_runs_its_control_daemons_and_answers_with_the_mps_environment(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, output = demo(capsys, "--config-file", str(CONFIGS / "mps.yaml"))
    assert rc == 0, output
    assert "nvidia.com/gpu: 32 devices advertised over ListAndWatch" in output
    assert "Unhealthy" not in output  # each GPU's control daemon was ready before the pod came
    assert "Admitted a pod asking for nvidia.com/gpu: 1\n" in output  # failRequestsGreaterThanOne for MPS
    assert "  env CUDA_MPS_PIPE_DIRECTORY=/mps/nvidia.com/gpu/pipe" in output
    assert "  env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25" in output
    assert eventually(lambda: demo_processes(output) == []), demo_processes(output)


def test_a_pod_asking_for_more_than_the_node_has_is_not_admitted(capsys: pytest.CaptureFixture[str]) -> None:
    rc, output = demo(capsys, "--pod-devices", "20")
    assert rc == 1
    assert "Admitted" not in output
    assert output.endswith(
        "\nNot admitted: a pod asking for nvidia.com/gpu: 20 stays Pending; the node has 8 healthy "
        "nvidia.com/gpu (kubelet: Insufficient nvidia.com/gpu)\n"
    )


def test_allocate_refusing_the_sample_pod_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ("--simulate", "t4-single", "--config-file", str(CONFIGS / "time-slicing-rename.yaml"))
    rc, output = demo(capsys, *argv, "--pod-devices", "2")
    assert rc == 1
    assert output.endswith(
        "\nNot admitted: a pod asking for nvidia.com/gpu.shared: 2: UnexpectedAdmissionError: Allocate "
        "failed due to rpc error: code = InvalidArgument desc = container_requests[0]: request for "
        "'nvidia.com/gpu.shared: 2' too large: maximum request size for shared resources is 1, which is "
        "unexpected\n"
    )
    rc, output = demo(capsys, *argv)  # by default the sample pod asks for what the resource admits
    assert rc == 0 and "Admitted a pod asking for nvidia.com/gpu.shared: 1\n" in output


def test_the_demo_leaves_nothing_behind(capsys: pytest.CaptureFixture[str]) -> None:
    rc, output = demo(capsys, "--simulate", "t4-single", "--config-file", str(CONFIGS / "mps.yaml"))
    assert rc == 0, output
    root = re.search(r"Kubelet stand-in in (\S+)/kubelet", output)
    assert root is not None and not os.path.exists(root.group(1))
    assert eventually(lambda: demo_processes(output) == []), demo_processes(output)


def test_the_demo_stops_the_plugin_before_its_kubelet(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    # Stopped after the kubelet stand-in, the plugin saw kubelet's stream end and warned that it would
    # register again: the last lines a new user saw were a WARNING.
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin")
    rc, _ = demo(capsys)
    assert rc == 0
    messages = [r.getMessage() for r in caplog.records]
    assert "stopped" in messages
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert not [m for m in messages if "registering nvidia.com/gpu again" in m]
