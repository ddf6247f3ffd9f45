"""The daemon keeps serving through what a node throws at it: kubelet restarts, config reloads under load,
XID storms, failing NVML calls and hostile gRPC requests.

In-process Daemon on simulated nodes; the kubelet side is the KubeletStandIn over real unix sockets.
Each loop has a second, soak-sized parameter marked `soak`: `make test` deselects it, `make soak` runs it.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import shutil
import tempfile
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pynvml
import pytest

from nvidia_device_plugin.api.v1beta1 import api_pb2 as pb
from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, ReplicatedResources, Sharing
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import physical_uuid_of
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, gpu_uuids, simulator, start_daemon
from support.kubelet_standin import kubelet_standin
from support.markers import soak
from support.threads import counted_threads
from support.waiting import scaled

STATUS = grpc.StatusCode


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def allocate_request(*containers: list[str]) -> pb.AllocateRequest:
    return pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devices_ids=c) for c in containers]
    )


def visible_devices(kubelet: KubeletStandIn, ids: list[str]) -> str:
    response = kubelet.allocate(GPU, [ids])
    return response.container_responses[0].envs["NVIDIA_VISIBLE_DEVICES"]


def health(kubelet: KubeletStandIn, uuid: str) -> str:
    device = kubelet.devices(GPU).get(uuid)
    return device.health if device is not None else "missing"


def rpc_error(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value


# ---- kubelet restarts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("restarts", [100, soak(1000)])
def test_kubelet_restarts_reregister_every_time_without_leaking(
    daemon: Daemon, kubelet: KubeletStandIn, restarts: int
) -> None:
    uuid = gpu_uuids(daemon)[0]
    # One restart first, so that lazily created threads and descriptors exist in both counts.
    kubelet.restart()
    assert kubelet.wait_for_resources([GPU])
    assert kubelet.wait_for(daemon.manager.all_registered)
    threads_before, fds_before = counted_threads(), open_fds()

    for n in range(restarts):
        kubelet.restart()
        assert kubelet.wait_for_resources([GPU], timeout=scaled(10)), (
            f"not registered again after restart {n + 1}"
        )
    assert visible_devices(kubelet, [uuid]) == uuid
    assert kubelet.wait_for(daemon.manager.all_registered)
    # The stand-in's ListAndWatch threads of the previous kubelet end as their streams close.
    assert kubelet.wait_for(lambda: counted_threads() <= threads_before + 2, timeout=scaled(10)), (
        f"threads grew from {threads_before} to {counted_threads()} over {restarts} restarts"
    )
    assert open_fds() <= fds_before + 8, f"descriptors grew from {fds_before} to {open_fds()}"
    assert len(kubelet.registrations) >= restarts


# ---- Allocate under reloads ---------------------------------------------------------------------------


@pytest.mark.parametrize("reloads", [30, soak(200)])
def test_concurrent_allocate_during_config_reloads(
    plugin_dir: Path, kubelet: KubeletStandIn, reloads: int
) -> None:
    whole = Config()
    shared = Config(
        sharing=Sharing(
            time_slicing=ReplicatedResources(resources=(ReplicatedResource(name=GPU, replicas=4),))
        )
    )
    current = [whole]
    daemon = start_daemon(plugin_dir, load_config=lambda: current[0])
    try:
        assert kubelet.wait_for_resources([GPU])
        assert daemon.snapshot is not None
        inventory = daemon.snapshot.inventory
        id_sets = [[d.id for d in build_resources(inventory, c)[0].devices] for c in (whole, shared)]
        stub = kubelet.plugin(GPU).stub
        stop = threading.Event()
        lock = threading.Lock()
        outcomes: Counter[str] = Counter()
        failures: list[str] = []

        def allocate_until_stopped(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                ids = rng.sample(rng.choice(id_sets), rng.choice((1, 2)))
                try:
                    response = stub.Allocate(allocate_request(ids), timeout=scaled(5))
                except grpc.RpcError as exc:
                    vanished = exc.code() == STATUS.INVALID_ARGUMENT and "unknown device ID" in (
                        exc.details() or ""
                    )
                    with lock:
                        if vanished:
                            outcomes["vanished"] += 1
                            continue
                        failures.append(f"{ids}: {exc.code()} {exc.details()}")
                    return
                expected = ",".join(dict.fromkeys(physical_uuid_of(i) for i in ids))
                got = response.container_responses[0].envs.get("NVIDIA_VISIBLE_DEVICES")
                with lock:
                    if got != expected:
                        failures.append(f"{ids}: NVIDIA_VISIBLE_DEVICES={got!r}, expected {expected!r}")
                        return
                    outcomes["ok"] += 1

        threads = [
            threading.Thread(target=allocate_until_stopped, args=(n,), name=f"alloc-{n}") for n in range(8)
        ]
        for thread in threads:
            thread.start()
        try:
            for n in range(reloads):
                current[0] = shared if n % 2 == 0 else whole
                assert daemon.reload(f"test reload {n}")
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=scaled(10))
        assert not [t.name for t in threads if t.is_alive()], "an Allocate call hung"
        assert not failures, failures[:5]
        assert outcomes["ok"] > 0 and outcomes["vanished"] > 0, outcomes
        assert kubelet.wait_for(lambda: len(kubelet.devices(GPU)) == 8)
    finally:
        daemon.stop()


# ---- XID storm ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("storm", [10_000, soak(200_000)])
def test_xid_storm_leaves_other_gpus_allocatable(daemon: Daemon, kubelet: KubeletStandIn, storm: int) -> None:
    sim = simulator(daemon)
    uuids = gpu_uuids(daemon)
    stormed, healthy, sentinel = (0, 1, 2), (4, 5, 6), 7
    stop = threading.Event()
    successes: Counter[int] = Counter()
    failures: list[str] = []

    def allocate_healthy(index: int) -> None:
        while not stop.is_set():
            try:
                got = visible_devices(kubelet, [uuids[index]])
            except grpc.RpcError as exc:
                failures.append(f"GPU {index}: {exc.code()} {exc.details()}")
                return
            if got != uuids[index]:
                failures.append(f"GPU {index}: NVIDIA_VISIBLE_DEVICES={got}")
                return
            successes[index] += 1

    threads = [threading.Thread(target=allocate_healthy, args=(i,), name=f"alloc-{i}") for i in healthy]
    for thread in threads:
        thread.start()
    try:
        xids = (79, 13, 48, 31, 94, 43)  # critical and ignored (13, 31, 43) ones, interleaved
        for n in range(storm):
            sim.inject_xid(stormed[n % len(stormed)], xids[n % len(xids)])
        # Events are read in order: once the sentinel's XID is seen, the whole storm has been handled.
        sim.inject_xid(sentinel, 79)
        assert kubelet.wait_for(
            lambda: health(kubelet, uuids[sentinel]) == "Unhealthy", timeout=scaled(30 + storm / 1000)
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=scaled(10))
    assert not failures, failures[:5]
    assert_all(healthy, lambda i: successes[i] > 0, successes)
    for i in stormed:
        assert health(kubelet, uuids[i]) == "Unhealthy"
        err = rpc_error(functools.partial(kubelet.allocate, GPU, [[uuids[i]]]))
        assert err.code() == STATUS.INVALID_ARGUMENT and "unhealthy" in (err.details() or "")
    for i in (*healthy, 3):
        assert health(kubelet, uuids[i]) == "Healthy"
        assert visible_devices(kubelet, [uuids[i]]) == uuids[i]


# ---- NVML failing mid-run ------------------------------------------------------------------------------


def test_failing_event_wait_is_retried_and_health_checks_go_on(
    daemon: Daemon, kubelet: KubeletStandIn, caplog: pytest.LogCaptureFixture
) -> None:
    sim = simulator(daemon)
    uuids = gpu_uuids(daemon)
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin")
    sim.fail_next("nvmlEventSetWait_v2", pynvml.NVML_ERROR_UNKNOWN, 2)
    # The wait already in progress returns this XID; the next two waits fail.
    sim.inject_xid(1, 79)
    assert kubelet.wait_for(lambda: health(kubelet, uuids[1]) == "Unhealthy", timeout=scaled(15))
    sim.inject_xid(2, 79)  # lands while the wait is failing or backing off; must still be seen
    assert visible_devices(kubelet, [uuids[0]]) == uuids[0]
    assert kubelet.wait_for(lambda: health(kubelet, uuids[2]) == "Unhealthy", timeout=scaled(15))
    assert [health(kubelet, u) for u in uuids].count("Unhealthy") == 2
    assert "waiting for NVML events failed" in caplog.text
    assert visible_devices(kubelet, [uuids[0]]) == uuids[0]


def test_lost_gpu_goes_unhealthy_and_the_rest_keep_serving(daemon: Daemon, kubelet: KubeletStandIn) -> None:
    sim = simulator(daemon)
    uuids = gpu_uuids(daemon)
    # The GPU falls off the bus: NVML answers GPU_IS_LOST for it, and the event wait reports it too.
    sim.set_lost(2, True)
    sim.fail_next("nvmlEventSetWait_v2", pynvml.NVML_ERROR_GPU_IS_LOST, 1)
    assert kubelet.wait_for(lambda: health(kubelet, uuids[2]) == "Unhealthy", timeout=scaled(15))
    assert [health(kubelet, u) for u in uuids].count("Unhealthy") == 1
    err = rpc_error(lambda: kubelet.allocate(GPU, [[uuids[2]]]))
    assert err.code() == STATUS.INVALID_ARGUMENT
    assert visible_devices(kubelet, [uuids[3], uuids[4]]) == f"{uuids[3]},{uuids[4]}"

    # A reload cannot rediscover the node while a GPU is lost; whatever it decides, serving goes on.
    daemon.reload("test reload with a lost GPU")
    assert daemon.manager.served() == {GPU}
    assert visible_devices(kubelet, [uuids[5]]) == uuids[5]
    # Health checking is still alive after all that.
    sim.inject_xid(6, 79)
    assert kubelet.wait_for(lambda: health(kubelet, uuids[6]) == "Unhealthy", timeout=scaled(15))


def test_discovery_failing_during_reload_keeps_the_last_good_config(
    daemon: Daemon, kubelet: KubeletStandIn
) -> None:
    sim = simulator(daemon)
    uuids = gpu_uuids(daemon)
    sim.fail_next("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN, 1)
    assert not daemon.reload("test reload with NVML failing")
    assert len(kubelet.devices(GPU)) == 8
    assert visible_devices(kubelet, [uuids[7]]) == uuids[7]
    assert daemon.reload("test reload with NVML working again")


# ---- hostile requests ---------------------------------------------------------------------------------

MB = 1024 * 1024


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[Daemon, KubeletStandIn]]:
    """One daemon for the hostile-request tests: they change nothing, so they can share it."""
    plugin_dir = Path(tempfile.mkdtemp(prefix=f"nvdp-{os.getpid()}-", dir="/tmp"))
    try:
        with kubelet_standin(plugin_dir) as k:
            d = start_daemon(plugin_dir)
            try:
                assert k.wait_for_resources([GPU])
                yield d, k
            finally:
                d.stop()
    finally:
        shutil.rmtree(plugin_dir, ignore_errors=True)


def _allocate_cases(uuids: list[str]) -> dict[str, tuple[pb.AllocateRequest, grpc.StatusCode]]:
    return {
        "unknown ID": (
            allocate_request(["GPU-00000000-0000-0000-0000-000000000000"]),
            STATUS.INVALID_ARGUMENT,
        ),
        "empty device list": (allocate_request([]), STATUS.INVALID_ARGUMENT),
        "empty device list in the second container": (
            allocate_request([uuids[0]], []),
            STATUS.INVALID_ARGUMENT,
        ),
        "duplicate IDs": (allocate_request([uuids[1], uuids[1]]), STATUS.INVALID_ARGUMENT),
        "10,000 IDs": (allocate_request([f"GPU-{n}" for n in range(10_000)]), STATUS.INVALID_ARGUMENT),
        "10,000 copies of a valid ID": (allocate_request([uuids[2]] * 10_000), STATUS.INVALID_ARGUMENT),
        "100,000 IDs (over the 1 MiB request limit)": (
            allocate_request([f"GPU-{n}" for n in range(100_000)]),
            STATUS.RESOURCE_EXHAUSTED,
        ),
        "20 MB ID (over the request limit)": (allocate_request(["G" * (20 * MB)]), STATUS.RESOURCE_EXHAUSTED),
    }


@pytest.mark.parametrize(
    "case",
    [
        "unknown ID",
        "empty device list",
        "empty device list in the second container",
        "duplicate IDs",
        "10,000 IDs",
        "10,000 copies of a valid ID",
        "100,000 IDs (over the 1 MiB request limit)",
        "20 MB ID (over the request limit)",
    ],
)
def test_malformed_allocate_gets_an_error_and_serving_goes_on(
    served: tuple[Daemon, KubeletStandIn], case: str
) -> None:
    daemon, kubelet = served
    uuids = gpu_uuids(daemon)
    request, code = _allocate_cases(uuids)[case]
    err = rpc_error(lambda: kubelet.plugin(GPU).stub.Allocate(request, timeout=scaled(10)))
    assert err.code() == code, err.details()
    assert visible_devices(kubelet, [uuids[3]]) == uuids[3]


def test_multi_megabyte_id_is_refused_with_a_short_message(
    served: tuple[Daemon, KubeletStandIn], caplog: pytest.LogCaptureFixture
) -> None:
    # Under the 1 MiB request limit, but echoing it whole would exceed gRPC's 16 KiB metadata limit (the
    # client would see RESOURCE_EXHAUSTED "Stream removed") and put 900 KB into one log line.
    daemon, kubelet = served
    caplog.set_level(logging.INFO, logger="nvidia_device_plugin")
    err = rpc_error(
        lambda: kubelet.plugin(GPU).stub.Allocate(allocate_request(["G" * (900 * 1024)]), timeout=scaled(10))
    )
    assert err.code() == STATUS.INVALID_ARGUMENT, err.details()
    assert "unknown device ID" in (err.details() or "")
    assert len(err.details() or "") < 4096
    assert max(len(r.getMessage()) for r in caplog.records) < 4096
    uuid = gpu_uuids(daemon)[4]
    assert visible_devices(kubelet, [uuid]) == uuid


def test_empty_container_list_gets_an_empty_answer(served: tuple[Daemon, KubeletStandIn]) -> None:
    daemon, kubelet = served
    # kubelet never sends one; NVIDIA's plugin answers it with no container responses, and so does this one.
    response = kubelet.plugin(GPU).stub.Allocate(pb.AllocateRequest(), timeout=scaled(5))
    assert len(response.container_responses) == 0
    uuid = gpu_uuids(daemon)[0]
    assert visible_devices(kubelet, [uuid]) == uuid


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("size 0", "allocation_size"),
        ("size above available", "allocation_size"),
        ("must_include not in available", "must_include"),
        ("unknown available ID", "unknown device ID"),
        ("more must_include than size", "must_include"),
    ],
)
def test_malformed_preferred_allocation_gets_invalid_argument(
    served: tuple[Daemon, KubeletStandIn], case: str, needle: str
) -> None:
    daemon, kubelet = served
    u = gpu_uuids(daemon)
    available, must_include, size = {
        "size 0": (u, [], 0),
        "size above available": (u[:3], [], 4),
        "must_include not in available": (u[:4], [u[6]], 2),
        "unknown available ID": ([*u[:4], "GPU-nope"], [], 2),
        "more must_include than size": (u, u[:3], 2),
    }[case]
    err = rpc_error(lambda: kubelet.preferred(GPU, available, must_include, size))
    assert err.code() == STATUS.INVALID_ARGUMENT
    assert needle in (err.details() or "")
    chosen = kubelet.preferred(GPU, u, [u[5]], 2)
    assert len(chosen) == 2 and u[5] in chosen
