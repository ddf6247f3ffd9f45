"""Allocate while another client loads the daemon, beside Allocate on the idle daemon (issue 32):

* contention.metrics_storm: 16 scrapers cycling through the 14 exposition formats, on a node of 62,400
  device IDs (item 5: Allocate's median went from 1.8 ms to 21.7 ms);
* contention.preferred_flood: 4 clients looping GetPreferredAllocation of 3 containers, each offered
  2,800 of 5,600 MIG replicas (item 9: from 1.6 ms to 116.6 ms).

The load runs in its own process (bench/load.py). Target: Allocate's median at most 2x its idle median.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from bench.figures import Figure, figure, median_within
from bench.latency import GPU, MIG_1G
from bench.procs import REPO_ROOT, BenchError, DaemonProcess, child_env, daemon_process, free_port
from bench.sampling import Budget, in_ms
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb

WITHIN = 2.0
SCRAPERS = 16
FLOODERS = 4


def metrics_storm(budget: Budget) -> list[Figure]:
    port = free_port()
    with daemon_process("t4-32", "time-slicing-1950", metrics_address=f"127.0.0.1:{port}") as daemon:
        idle, loaded, load = _idle_and_loaded(daemon, GPU, ["metrics", str(port), str(SCRAPERS)], budget)
    return [
        figure(
            "contention.metrics_storm",
            f"Allocate 1 of 62,400 replicas, {SCRAPERS} scrapers cycling 14 formats",
            "ms",
            loaded,
            ("Allocate idle", idle),
            median_within(WITHIN),
            note=f"the scrapers' {load} while Allocate was sampled",
        )
    ]


def preferred_flood(budget: Budget) -> list[Figure]:
    with daemon_process("a100-8x7-mig", "mig-1g-time-slicing-100") as daemon:
        plan = next(p for p in daemon.plans if p.name == MIG_1G)
        ids_file = daemon.plugin_dir / "offered-ids"
        ids_file.write_text("\n".join(d.id for d in plan.devices[::2]))  # 2,800 of 5,600
        socket_path = daemon.plugin_dir / plan.socket_name
        args = ["preferred", str(socket_path), str(FLOODERS), str(ids_file)]
        idle, loaded, load = _idle_and_loaded(daemon, MIG_1G, args, budget)
    return [
        figure(
            "contention.preferred_flood",
            f"Allocate 1 of 5,600 MIG replicas, {FLOODERS} clients flooding GetPreferredAllocation",
            "ms",
            loaded,
            ("Allocate idle", idle),
            median_within(WITHIN),
            note=f"the flooders' {load} while Allocate was sampled (3 x 2,800 IDs a call)",
        )
    ]


def _idle_and_loaded(
    daemon: DaemonProcess, resource: str, load_args: Sequence[str], budget: Budget
) -> tuple[list[float], list[float], str]:
    """Allocate latencies (ms) idle, then under the load process; and what the load process counted."""
    plan = next(p for p in daemon.plans if p.name == resource)
    stub = daemon.kubelet.plugin(resource).stub
    ids = [d.id for d in plan.devices]
    window = budget.contention_seconds
    _sample(stub, ids, min(budget.warmup, 20), window)
    idle = _sample(stub, ids, budget.allocate_calls, window)
    load = subprocess.Popen(
        [sys.executable, "-m", "bench.load", *load_args],
        cwd=REPO_ROOT,
        env=child_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert load.stdout is not None and load.stdin is not None
        if load.stdout.readline().strip() != "ready":
            raise BenchError(f"the load process ({' '.join(load_args[:1])}) did not start")
        time.sleep(0.5)  # every load thread past its first answer
        loaded = _sample(stub, ids, budget.allocate_calls, window)
        load.stdin.close()
        counted = load.stdout.read().strip()
    finally:
        if load.poll() is None:
            load.wait(60)
    return in_ms(idle), in_ms(loaded), counted


def _sample(stub: Any, ids: Sequence[str], calls: int, window_s: float) -> list[float]:
    """Seconds per Allocate of one ID (a different one each call), for `calls` calls or `window_s` seconds."""
    samples: list[float] = []
    deadline = time.perf_counter() + window_s
    clock = time.perf_counter
    for n in range(max(1, calls)):
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devices_ids=[ids[n % len(ids)]])]
        )
        started = clock()
        stub.Allocate(request, timeout=30)
        samples.append(clock() - started)
        if clock() > deadline:
            break
    return samples
