"""Issue 23 item 6, through a daemon process as kubelet sees it: the CDI names an admitted pod holds stay
defined across config changes that stop serving them, while kubelet's checkpoint holds them.

Kubelet keeps each Allocate response in `kubelet_internal_checkpoint` and replays it on every container
restart; the test plays kubelet: it admits a pod over the socket, writes the checkpoint as kubelet does,
changes the config (cdi-cri -> envvar, then back with deviceIDStrategy index) and sends SIGHUP, and reads
the spec directory the daemon writes, as a container runtime would resolve the pod's names.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cdi_support import defined_names, kubelet_checkpoint

from nvidia_device_plugin.cdi.model import CDI_VENDOR
from nvidia_device_plugin.cdi.retention import CHECKPOINT_FILE
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.waiting import scaled


class DaemonProcess:
    """`nvidia-device-plugin run --simulate` with its output collected line by line."""

    def __init__(self, *args: str) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "nvidia_device_plugin", "run", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name="daemon-output")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    def count(self, text: str) -> int:
        return sum(text in line for line in list(self.lines))

    def spec_dir(self) -> Path:
        """Where the daemon writes its specs (a simulated node keeps them in its own tree)."""
        line = next(line for line in list(self.lines) if "CDI spec " in line and " written:" in line)
        return Path(line.split("CDI spec ", 1)[1].split(" written:", 1)[0]).parent

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=scaled(30))
        finally:
            self.proc.kill()
            self._reader.join(timeout=scaled(30))


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\nflags: {plugin: {deviceListStrategy: cdi-cri}}\n")
    return path


@pytest.fixture
def daemon_process(plugin_dir: Path, config_file: Path) -> Iterator[DaemonProcess]:
    process = DaemonProcess(
        "--simulate", "dgx-a100", "--device-plugin-path", str(plugin_dir), "--metrics-address", "",
        "--config-file", str(config_file),
    )  # fmt: skip
    yield process
    assert process.stop() == 0, "".join(process.lines)


def _reload(process: DaemonProcess, kubelet: KubeletStandIn) -> None:
    # The daemon also reloads when it sees the file change: only the SIGHUP's reload is known to have read
    # the file whole (a watched write may be seen half-done, and its reload may land after the next step
    # began), so the test waits for that one.
    before = process.count("config reloaded (SIGHUP)")
    process.proc.send_signal(signal.SIGHUP)
    assert kubelet.wait_for(lambda: process.count("config reloaded (SIGHUP)") > before, timeout=scaled(30)), (
        "".join(process.lines)
    )


def _write_config(path: Path, text: str) -> None:
    """As a ConfigMap update lands: the new file in one step, never a half-written one."""
    staged = path.with_suffix(".new")
    staged.write_text(text)
    os.replace(staged, path)


def test_the_names_an_admitted_pod_holds_resolve_after_the_config_stops_serving_them(
    plugin_dir: Path, config_file: Path, kubelet: KubeletStandIn, daemon_process: DaemonProcess
) -> None:
    assert kubelet.wait_for_resources([GPU], timeout=scaled(30))
    ids, response = kubelet.admit(GPU, 2)
    held = {d.name for d in response.cdi_devices}
    assert len(held) == 2 and all(n.startswith(f"{CDI_VENDOR}/gpu=GPU-") for n in held)
    checkpoint = plugin_dir / CHECKPOINT_FILE
    kubelet_checkpoint(checkpoint, [("pod-1", GPU, ids, response)])
    spec_dir = daemon_process.spec_dir()
    assert held <= defined_names(spec_dir)

    _write_config(config_file, "version: v1\nflags: {plugin: {deviceListStrategy: envvar}}\n")
    _reload(daemon_process, kubelet)
    assert defined_names(spec_dir) == held  # the spec stays, defining exactly what the pod holds
    _, envvar = kubelet.admit(GPU, 1)
    assert not envvar.cdi_devices and "NVIDIA_VISIBLE_DEVICES" in envvar.envs

    _write_config(
        config_file, "version: v1\nflags: {plugin: {deviceListStrategy: cdi-cri, deviceIDStrategy: index}}\n"
    )
    _reload(daemon_process, kubelet)
    names = defined_names(spec_dir)
    assert held <= names  # the UUID names beside the index ones
    assert {f"{CDI_VENDOR}/gpu={i}" for i in range(8)} <= names
    _, index = kubelet.admit(GPU, 1)
    assert {d.name for d in index.cdi_devices} <= names

    kubelet_checkpoint(checkpoint, [])  # the pod is gone: kubelet can no longer hand its names out
    _reload(daemon_process, kubelet)
    assert defined_names(spec_dir) == {f"{CDI_VENDOR}/gpu={i}" for i in range(8)}
    assert daemon_process.count("stay defined while admitted containers hold them") >= 1
    assert os.listdir(spec_dir) == [f"{CDI_VENDOR}-gpu.json"]
