"""SIGTERM while an NVML call hangs: the daemon exits within kubelet's grace period, cleans up its socket,
and says which call held NVML, instead of waiting on the driver (nvml/bounded.py's stop_waiting, shutdown).

The daemon runs as its own process (`run --simulate`), a process this test starts and signals; the hang comes
from the simulated events feed, as a GPU reset makes a real driver's calls block, and the simulated driver's
nvmlShutdown blocks too, as a real one waits on the call its reset holds.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from pathlib import Path

from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU
from support.waiting import CHILD_GUARD_S, wait_for

KUBELET_GRACE_S = 30.0  # terminationGracePeriodSeconds' default: past it the pod is killed


def test_sigterm_with_an_nvml_call_hung_exits_in_time_naming_the_call(
    tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn
) -> None:
    events = tmp_path / "events.jsonl"
    events.touch()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "nvidia_device_plugin", "run", "--simulate", "dgx-a100",
            "--device-plugin-path", str(plugin_dir), "--metrics-address", "",
            "--simulate-events", str(events), "--nvml-call-deadline", "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), name="daemon-output")
    reader.start()
    try:
        assert kubelet.wait_for_resources([GPU], timeout=CHILD_GUARD_S)
        hangs = [{"gpu": 3, "hang": "nvmlDeviceGetMemoryInfo"}, {"gpu": "any", "hang": "nvmlShutdown"}]
        events.write_text("".join(json.dumps(hang) + "\n" for hang in hangs))
        # The liveness check (every 5 s) finds GPU 3's call hung, and after its deadline it is stuck.
        wait_for(
            lambda: any("nvmlDeviceGetMemoryInfo on GPU 3 has not returned" in line for line in lines),
            "GPU 3's call to be stuck",
            timeout=CHILD_GUARD_S,
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=KUBELET_GRACE_S)
    finally:
        proc.kill()
        reader.join(timeout=CHILD_GUARD_S)
    output = "".join(lines)
    assert proc.returncode == 0, output
    assert not (plugin_dir / "nvidia-gpu.sock").exists()
    assert "NVML not shut down: GPU 3 is stuck in nvmlDeviceGetMemoryInfo" in output, output
