"""What the daemon says at start and at every reload (issue 21 item 7), and the active-config metric.

Like NVIDIA's `Running with config: {...}`: which config file was chosen and why, every setting in force,
the resources and their device counts; `--log-level debug` adds discovery and selection decisions.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.main import build_parser
from nvidia_device_plugin.config.flags import resolve_config
from nvidia_device_plugin.config.render import config_document
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.configs import configmap_volume as configmap
from support.daemon_support import GPU, start_daemon

TS4 = "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4}]}}\n"


@pytest.fixture
def started(plugin_dir: Path, kubelet: KubeletStandIn, tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    mount = configmap(tmp_path / "cm", {"default": TS4, "a100": "version: v1\n"})
    environ = {"NVDP_CONFIG_DIR": str(mount), "NVDP_CONFIG_NAME": "t4", "NVDP_CONFIG_DEFAULT": "default"}
    args = build_parser(environ).parse_args(["run"])
    daemon = start_daemon(plugin_dir, load_config=lambda: resolve_config(args, environ))
    assert kubelet.wait_for_resources([GPU])
    yield daemon, mount
    daemon.stop()


def lines(caplog: pytest.LogCaptureFixture, prefix: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


def metric(daemon: Daemon, name: str) -> list[str]:
    body, _ = daemon.metrics.render("text/plain")
    return [line for line in body.decode().splitlines() if line.startswith(name + "{")]


def test_start_says_which_config_why_every_setting_and_the_resources(
    caplog: pytest.LogCaptureFixture, plugin_dir: Path, kubelet: KubeletStandIn, tmp_path: Path
) -> None:
    caplog.set_level(logging.INFO)
    mount = configmap(tmp_path / "cm", {"default": TS4})
    environ = {"NVDP_CONFIG_DIR": str(mount), "NVDP_CONFIG_NAME": "t4", "NVDP_CONFIG_DEFAULT": "default"}
    args = build_parser(environ).parse_args(["run"])
    daemon = start_daemon(plugin_dir, load_config=lambda: resolve_config(args, environ))
    try:
        (line,) = lines(caplog, "config: ")
        why, _, document = line.partition("; running with config: ")
        assert (
            why
            == f"config: --config-default 'default' in {mount} (the --config-name 't4' does not exist there)"
        )
        assert daemon.snapshot is not None
        assert json.loads(document) == config_document(daemon.snapshot.config)
        assert lines(caplog, "resources: ") == [
            "resources: nvidia.com/gpu: 32 devices (8 GPUs x 4 replicas, time-slicing)"
        ]
        assert metric(daemon, "nvidia_device_plugin_active_config") == [
            f'nvidia_device_plugin_active_config{{file="{mount / "default"}",source="config-default"}} 1.0'
        ]
    finally:
        daemon.stop()


def test_every_reload_says_it_again(
    started: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture, kubelet: KubeletStandIn
) -> None:
    daemon, mount = started
    caplog.set_level(logging.INFO)
    (mount / "..data" / "default").write_text("version: v1\nflags: {migStrategy: none}\n")
    assert daemon.reload("SIGHUP")
    assert lines(caplog, "resources: ") == ["resources: nvidia.com/gpu: 8 devices (8 GPUs)"]
    assert len(lines(caplog, "config: --config-default 'default'")) == 1
    assert daemon.reload("SIGHUP")  # unchanged, and said again: every reload names its config
    assert len(lines(caplog, "config: --config-default 'default'")) == 2


def test_debug_shows_discovery_and_selection_decisions(
    plugin_dir: Path, kubelet: KubeletStandIn, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: v1\nflags: {resourceNaming: true}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0, 1]}]}}\n"
    )
    args = build_parser({}).parse_args(["run", "--config-file", str(path)])
    daemon = start_daemon(plugin_dir, load_config=lambda: resolve_config(args, {}))
    try:
        assert f"config: --config-file {path}" in [
            r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG
        ]
        found = lines(caplog, "discovery: GPU ")
        assert len(found) == 8
        assert re.fullmatch(
            r"discovery: GPU 0 \(GPU-[0-9a-f-]+\) NVIDIA A100-SXM4-80GB, 80\.0 GiB, PCI [0-9A-F:.]+, NUMA 0, "
            r"MIG off: advertised as nvidia\.com/gpu",
            found[0],
        ), found[0]
        assert lines(caplog, "sharing: ") == [
            "sharing: sharing.timeSlicing.resources[0] (nvidia.com/gpu, 2 replicas) shares 2 devices as "
            "nvidia.com/gpu"
        ]
    finally:
        daemon.stop()


def test_without_debug_there_are_no_decision_lines(
    started: tuple[Daemon, Path], caplog: pytest.LogCaptureFixture
) -> None:
    daemon, _ = started
    caplog.set_level(logging.INFO)
    assert daemon.reload("SIGHUP")
    assert lines(caplog, "discovery: GPU ") == []
