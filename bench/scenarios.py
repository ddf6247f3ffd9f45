"""The measurements, by name (SCENARIOS). Each scenario spawns what it measures, returns Figures, and
cleans up after itself. The call-latency scenarios are in latency.py; sample counts in sampling.py.
"""

from __future__ import annotations

import functools
import json
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench.contention import metrics_storm, preferred_flood
from bench.figures import Figure, figure, median_within, worst_under
from bench.latency import GPU, MIG_1G, allocate_latency, preferred_latency, spread
from bench.procs import (
    BenchError,
    DaemonProcess,
    config_path,
    cpu_seconds,
    daemon_process,
    echo_server,
    node_path,
    python_pass_seconds,
    rss_mb,
    short_tmp_dir,
    timed_command,
)
from bench.sampling import MS, Budget, in_ms
from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.cli.planview import plan_to_json
from nvidia_device_plugin.config.loader import load_config_file
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon, DaemonOptions
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.device_lists import KUBELET_RECEIVE_LIMIT
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.snapshot import build_snapshot
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

# Issue 28's start-up targets, each beside the bare-grpcio reference of the same run (the reference is what
# any Python gRPC device plugin pays; NVIDIA's Go binary registers in ~0.03 s with 21 MiB).
STARTUP_WITHIN = 2.0  # spawn -> registered and listed, dgx-a100 (8 GPUs)
RSS_WITHIN = 1.25  # RSS after start-up, 800 devices


# ---- health propagation ------------------------------------------------------------------------------------

HEALTH_NODE = "t4-32"  # 32 GPUs: a fresh one for every injection, so no recovery is needed


def _injection_order(count: int) -> list[int]:
    """Alternate between the two NUMA halves of the 32-GPU node: 0, 16, 1, 17, ..."""
    order = [i // 2 + (16 if i % 2 else 0) for i in range(32)]
    return order[: min(count, 32)]


def health_propagation(budget: Budget) -> list[Figure]:
    """XID injected -> the ListAndWatch message that shows the GPU Unhealthy arrives at the kubelet side."""
    target = worst_under(50, "ms")
    order = _injection_order(budget.health_injections)
    with daemon_process(HEALTH_NODE, events=True) as daemon:
        uuids = [d.physical_uuid for d in daemon.plans[0].devices]
        through_file = in_ms(
            _propagate(
                daemon.kubelet, uuids, order, lambda i: daemon.inject(json.dumps({"gpu": i, "xid": 79}))
            )
        )
    in_process = in_ms(_health_in_process(order))
    return [
        figure(
            "health.events_file",
            "XID -> ListAndWatch, injected through --simulate-events",
            "ms",
            through_file,
            target=target,
            note="includes the simulator's events-file feeder (woken by inotify), not only the plugin",
        ),
        figure(
            "health.in_process",
            "XID -> ListAndWatch, injected into the simulator directly",
            "ms",
            in_process,
            target=target,
            note="daemon, simulator and kubelet stand-in in one process (shared GIL); no file poll",
        ),
    ]


def _propagate(
    kubelet: KubeletStandIn, uuids: Sequence[str], order: Sequence[int], inject: Callable[[int], object]
) -> list[float]:
    samples = []
    rng = random.Random(0)
    for i in order:
        uuid = uuids[i]
        # Injecting right after the last update would phase-lock with any periodic poll on the way and
        # measure only its worst case; a random pause does not.
        time.sleep(rng.uniform(0.0, 0.06))
        started = time.perf_counter()
        inject(i)
        if not kubelet.wait_for(functools.partial(_unhealthy, kubelet, uuid), timeout=10):
            raise BenchError(f"GPU {i} ({uuid}) not reported Unhealthy within 10 s of its XID")
        samples.append(kubelet.plugin(GPU).last_update - started)
    return samples


def _unhealthy(kubelet: KubeletStandIn, uuid: str) -> bool:
    device = kubelet.devices(GPU).get(uuid)
    return device is not None and device.health == "Unhealthy"


def _health_in_process(order: Sequence[int]) -> list[float]:
    plugin_dir = short_tmp_dir("health")
    try:
        return _health_in_process_at(plugin_dir, order)
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)


def _health_in_process_at(plugin_dir: Path, order: Sequence[int]) -> list[float]:
    with KubeletStandIn(plugin_dir) as kubelet:
        node = node_path(HEALTH_NODE)
        daemon = Daemon(
            DaemonOptions(plugin_dir=plugin_dir, load_config=Config, open_nvml=lambda: open_nvml(node))
        )
        daemon.start()
        try:
            if not kubelet.wait_for_resources([GPU], timeout=30):
                raise BenchError("in-process daemon did not register nvidia.com/gpu")
            assert (
                daemon.nvml is not None and daemon.nvml.simulator is not None and daemon.snapshot is not None
            )
            sim = daemon.nvml.simulator
            uuids = [g.uuid for g in sorted(daemon.snapshot.inventory.gpus, key=lambda g: g.index)]
            return _propagate(kubelet, uuids, order, lambda i: sim.inject_xid(i, 79))
        finally:
            daemon.stop()


# ---- kubelet restarts and start-up -------------------------------------------------------------------------


def reregistration(budget: Budget) -> list[Figure]:
    """KubeletStandIn.restart() -> every resource registered again and its first ListAndWatch received."""
    figures = []
    for node, config, label in (
        ("dgx-a100", None, "dgx-a100, 1 resource"),
        ("a100-mig-mixed", "mig-mixed", "a100-mig-mixed, 4 resources"),
    ):
        with daemon_process(node, config) as daemon:
            samples = []
            for _ in range(budget.restarts):
                started = time.perf_counter()
                daemon.kubelet.restart()
                if not daemon.kubelet.wait_for_resources(daemon.resources, timeout=30):
                    raise BenchError(
                        f"{node}: not re-registered 30 s after a kubelet restart:\n{daemon.log_tail()}"
                    )
                samples.append(max(daemon.kubelet.plugin(n).last_update for n in daemon.resources) - started)
            figures.append(
                figure(
                    f"reregister.{node}",
                    f"Re-registration after kubelet restart, {label}",
                    "ms",
                    in_ms(samples),
                    target=worst_under(1000, "ms"),
                )
            )
    return figures


# (figure key, node, config, label). The target is on a node without a config file; the chart runs the plugin
# with one, which adds PyYAML and the config watch (whose event watch is made after the registrations).
_STARTUP_NODES = (
    ("dgx-a100", "dgx-a100", None, "dgx-a100, 8 GPUs"),
    ("dgx-a100.config", "dgx-a100", "time-slicing-100", "dgx-a100, a config file (800 replicas)"),
    ("a100-8x7-mig", "a100-8x7-mig", "mig-1g-time-slicing-100", "5,600 MIG replicas"),
)


def startup(budget: Budget) -> list[Figure]:
    """Process spawn -> every resource registered and listed; beside Python's and grpcio's own start-up.

    The reference and the daemons are spawned in turn (echo, each node, echo, ...), as the call scenarios
    interleave their calls: taken in blocks, a change in the machine's load between the blocks moved the
    ratio by 2x and more on a shared machine."""
    python_pass = [python_pass_seconds() * MS for _ in range(budget.spawns)]
    echo: list[float] = []
    echo_cpu: list[float] = []
    samples: dict[str, list[float]] = {key: [] for key, _, _, _ in _STARTUP_NODES}
    cpu: dict[str, list[float]] = {key: [] for key, _, _, _ in _STARTUP_NODES}
    floor: list[float] = []
    for _ in range(budget.spawns):
        with echo_server() as server:
            echo.append(server.started_s * MS)
            echo_cpu.append(cpu_seconds(server.pid) * MS)
        with echo_server("deps") as server:
            floor.append(server.started_s * MS)
        for key, node, config, _ in _STARTUP_NODES:
            with daemon_process(node, config) as daemon:
                cpu[key].append(cpu_seconds(daemon.pid) * MS)
                samples[key].append((daemon.ready_at - daemon.spawned_at) * MS)
    figures = [
        figure("startup.python", "python -c pass", "ms", python_pass),
        figure(
            "startup.floor",
            "Dependencies' floor: the server plus pynvml, argparse, a client call (the watch after it)",
            "ms",
            floor,
            ("idle grpcio server start", echo),
        ),
    ]
    for key, _, _, label in _STARTUP_NODES:
        figures.append(
            figure(
                f"startup.{key}",
                f"Start-up to registered, {label}",
                "ms",
                samples[key],
                ("idle grpcio server start", echo),
                median_within(STARTUP_WITHIN) if key == "dgx-a100" else None,
            )
        )
    # The same start-ups in CPU time (user + system, read as soon as each is ready): a figure the machine's
    # other load moves far less than the wall time above, whose reference varied 99-185 ms in one day here.
    for key, _, _, label in _STARTUP_NODES:
        figures.append(
            figure(
                f"startup.cpu.{key}",
                f"CPU to registered, {label}",
                "ms",
                cpu[key],
                ("idle grpcio server start", echo_cpu),
            )
        )
    return figures


# ---- memory and idle CPU --------------------------------------------------------------------------------


def memory(budget: Budget) -> list[Figure]:
    with echo_server() as echo:
        time.sleep(0.5)
        echo_rss = rss_mb(echo.pid)
    with echo_server("config") as echo:
        time.sleep(0.5)
        floor_rss = rss_mb(echo.pid)
    reference = ("idle grpcio server", [echo_rss])
    target = worst_under(60, "MB")
    floor_title = "Dependencies' floor: the server plus pynvml, argparse, PyYAML, two watches, a client call"
    figures = [figure("rss.floor", floor_title, "MB", [floor_rss], reference)]
    with daemon_process("dgx-a100", "time-slicing-100") as daemon:
        time.sleep(0.5)
        figures.append(
            figure(
                "rss.800.start",
                "RSS after start-up, 800 devices",
                "MB",
                [rss_mb(daemon.pid)],
                reference,
                median_within(RSS_WITHIN),
            )
        )
        _allocate_many(daemon, budget.memory_calls)
        figures.append(
            figure(
                "rss.800.allocated",
                f"RSS after {budget.memory_calls:,} Allocate calls, 800 devices",
                "MB",
                [rss_mb(daemon.pid)],
                reference,
                target,
            )
        )
    with daemon_process("a100-8x7-mig", "mig-1g-time-slicing-100") as daemon:
        time.sleep(0.5)
        figures.append(
            figure(
                "rss.5600.start", "RSS after start-up, 5,600 devices", "MB", [rss_mb(daemon.pid)], reference
            )
        )
    return figures


def _allocate_many(daemon: DaemonProcess, calls: int) -> None:
    ids = [d.id for d in daemon.plans[0].devices]
    stub = daemon.kubelet.plugin(daemon.plans[0].name).stub
    for n in range(calls):
        chosen = [ids[n % len(ids)]] if n % 10 else spread(ids[n % 100 :], 8, 8)
        stub.Allocate(
            pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=chosen)]),
            timeout=5,
        )


def idle_cpu(budget: Budget) -> list[Figure]:
    """CPU used while nothing happens (kubelet connected, streams open), beside an idle grpcio server."""
    window = budget.idle_seconds
    with echo_server() as echo, daemon_process("dgx-a100", "time-slicing-100") as daemon:
        time.sleep(min(2.0, window))
        pids = (daemon.pid, echo.pid)
        before = [cpu_seconds(p) for p in pids]
        started = time.perf_counter()
        time.sleep(window)
        elapsed = time.perf_counter() - started
        ours, theirs = (100.0 * (cpu_seconds(p) - b) / elapsed for p, b in zip(pids, before, strict=True))
    return [
        figure(
            "idle_cpu.800",
            f"Idle CPU over {window:g} s, 800 devices",
            "% of a core",
            [ours],
            ("idle grpcio server", [theirs]),
            worst_under(0.5, "%"),
            note=f"CPU time is counted in {1000 // _clock_ticks()} ms ticks; short windows are coarse",
        )
    ]


def _clock_ticks() -> int:
    return int(os.sysconf("SC_CLK_TCK"))


# ---- plan and ListAndWatch size -------------------------------------------------------------------------

PLAN_NODE = "a100-8x7-mig"
PLAN_CONFIG = "mig-1g-time-slicing-100"


def plan(budget: Budget) -> list[Figure]:
    config_file = config_path(PLAN_CONFIG)
    assert config_file is not None
    args = ["-m", "nvidia_device_plugin", "plan", "--simulate", node_path(PLAN_NODE)]
    args += ["--config-file", str(config_file), "--output", "json"]
    wall = [timed_command(args) * MS for _ in range(budget.plan_runs)]
    python_pass = [python_pass_seconds() * MS for _ in range(budget.plan_runs)]
    target = worst_under(1000, "ms")
    figures = [
        figure(
            "plan.subprocess",
            "plan --output json, 5,600 devices (process wall time)",
            "ms",
            wall,
            ("python -c pass", python_pass),
            target,
        ),
        figure(
            "plan.in_process",
            "build_resources + plan_to_json, 5,600 devices",
            "ms",
            _plan_in_process(config_file, max(budget.plan_runs, 3)),
            target=target,
        ),
    ]
    for node, config, resource, label in (
        ("dgx-a100", "time-slicing-100", GPU, "800 devices"),
        (PLAN_NODE, PLAN_CONFIG, MIG_1G, "5,600 devices"),
    ):
        with daemon_process(node, config) as daemon:
            message = pb.ListAndWatchResponse(devices=list(daemon.kubelet.devices(resource).values()))
            size = len(message.SerializeToString())
        figures.append(
            figure(
                f"listandwatch.{node}",
                f"ListAndWatch message, {label}",
                "bytes",
                [float(size)],
                target=worst_under(KUBELET_RECEIVE_LIMIT, "bytes", "4 MiB (kubelet's gRPC receive limit)"),
            )
        )
    return figures


def _plan_in_process(config_file: Path, runs: int) -> list[float]:
    config = load_config_file(config_file)
    session = open_nvml(node_path(PLAN_NODE))
    try:
        inventory = build_snapshot(session, config).inventory
    finally:
        session.close()
    samples = []  # the resources step alone, timed on the inventory the pipeline discovered once
    for _ in range(runs):
        started = time.perf_counter()
        plans = build_resources(inventory, config)
        plan_to_json(plans, inventory)
        samples.append((time.perf_counter() - started) * MS)
    return samples


SCENARIOS: dict[str, Callable[[Budget], list[Figure]]] = {
    "startup": startup,
    "allocate": allocate_latency,
    "preferred": preferred_latency,
    "health": health_propagation,
    "reregister": reregistration,
    "memory": memory,
    "idle": idle_cpu,
    "plan": plan,
    "contention": lambda budget: [*metrics_storm(budget), *preferred_flood(budget)],
}
