"""Hung NVML calls: the simulator hangs them as a driver in a GPU reset does (node file, events feed, its
controls), and nvml/bounded.py keeps every call within a deadline, one GPU's hang never another's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.nvml import events as nvml_events
from nvidia_device_plugin.nvml.bounded import NvmlCallStuck
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.nvml.sim.events import MalformedEvent, SimEvent, parse_event
from nvidia_device_plugin.nvml.sim.node import HangSpec, load_node, parse_node

from support.waiting import NVML_CALL_DEADLINE_S, wait_for


@pytest.fixture
def session() -> Iterator[NvmlSession]:
    opened = open_nvml("dgx-a100", call_timeout_s=NVML_CALL_DEADLINE_S)
    yield opened
    opened.close()


def _gpu(session: NvmlSession, index: int) -> tuple[object, str]:
    handle = session.nv.nvmlDeviceGetHandleByIndex(index)
    return handle, session.nv.nvmlDeviceGetUUID(handle)


def test_a_hung_call_is_stuck_at_its_deadline_and_its_gpu_fails_fast_until_it_returns(
    session: NvmlSession,
) -> None:
    assert session.simulator is not None and session.calls is not None
    changes: list[tuple[str, bool]] = []
    session.calls.subscribe(lambda call, stuck: changes.append((call, stuck)))
    handle, uuid = _gpu(session, 2)
    session.simulator.hang("nvmlDeviceGetMemoryInfo", 2)
    with pytest.raises(NvmlCallStuck, match=r"nvmlDeviceGetMemoryInfo on GPU 2 did not return within 1s"):
        session.nv.nvmlDeviceGetMemoryInfo(handle)
    with pytest.raises(NvmlCallStuck, match="GPU 2 is stuck in nvmlDeviceGetMemoryInfo") as refused:
        session.nv.nvmlDeviceGetName(handle)  # not tried: the lane still waits on the hung call
    assert classify(refused.value) is NvmlErrorKind.STUCK
    assert nvml_events.probe(session.nv, uuid).state == "stuck"
    other, other_uuid = _gpu(session, 3)  # another GPU is not held up
    assert session.nv.nvmlDeviceGetMemoryInfo(other).total > 0
    assert nvml_events.probe(session.nv, other_uuid).state == "ok"
    assert changes == [("nvmlDeviceGetMemoryInfo", True)]
    session.simulator.release("nvmlDeviceGetMemoryInfo", 2)
    wait_for(lambda: changes[-1] == ("nvmlDeviceGetMemoryInfo", False), "the hung call to return")
    assert session.nv.nvmlDeviceGetName(handle)
    assert nvml_events.probe(session.nv, uuid).state == "ok"


def test_a_hang_with_seconds_ends_by_itself(session: NvmlSession) -> None:
    assert session.simulator is not None
    handle, _ = _gpu(session, 1)
    session.simulator.hang("nvmlDeviceGetName", 1, seconds=NVML_CALL_DEADLINE_S * 2)
    with pytest.raises(NvmlCallStuck):
        session.nv.nvmlDeviceGetName(handle)

    def answers() -> bool:
        try:
            return bool(session.nv.nvmlDeviceGetName(handle))
        except pynvml.NVMLError:
            return False

    wait_for(answers, "the hang to end after its seconds")


def test_a_hang_without_gpu_hangs_the_call_everywhere_and_refuses_unknown_calls(session: NvmlSession) -> None:
    assert session.simulator is not None
    session.simulator.hang("nvmlSystemGetDriverVersion")
    with pytest.raises(NvmlCallStuck, match="nvmlSystemGetDriverVersion on NVML"):
        session.nv.nvmlSystemGetDriverVersion()
    with pytest.raises(ValueError, match="nvmlNoSuchCall is not a simulated pynvml function"):
        session.simulator.hang("nvmlNoSuchCall", 0)


def test_the_events_feed_hangs_and_releases_calls() -> None:
    assert parse_event('{"gpu": 2, "hang": "nvmlDeviceGetMemoryInfo", "seconds": 30}') == SimEvent(
        target=2, kind="hang", call="nvmlDeviceGetMemoryInfo", seconds=30.0
    )
    assert parse_event('{"gpu": "any", "hang": "nvmlEventSetWait_v2"}') == SimEvent(
        target=None, kind="hang", call="nvmlEventSetWait_v2"
    )
    assert parse_event('{"gpu": 2, "release": "nvmlDeviceGetMemoryInfo"}') == SimEvent(
        target=2, kind="release", call="nvmlDeviceGetMemoryInfo"
    )
    for line, complaint in (
        ('{"gpu": 2, "hang": "memory"}', "must name a pynvml call"),
        ('{"gpu": 2, "hang": "nvmlDeviceGetName", "seconds": 0}', '"seconds" must be a positive number'),
        ('{"gpu": 2, "xid": 79, "seconds": 3}', '"seconds" goes with "hang" only'),
    ):
        with pytest.raises(MalformedEvent, match=complaint):
            parse_event(line)


def test_node_files_hang_calls_from_the_start(tmp_path: Path) -> None:
    doc = {"gpus": [{"name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}] * 2}
    node = parse_node({**doc, "hangs": [{"call": "nvmlDeviceGetMemoryInfo", "gpu": 1, "seconds": 30}]}, "n")
    assert node.hangs == (HangSpec("nvmlDeviceGetMemoryInfo", 1, 30.0),)
    for hangs, complaint in (
        ([{"gpu": 1}], "must name a pynvml call"),
        ([{"call": "nvmlDeviceGetName", "gpu": 2}], "must be the index of one of the 2 GPUs"),
        ([{"call": "nvmlDeviceGetName", "seconds": -1}], "must be a positive number"),
        ([{"call": "nvmlDeviceGetName", "when": 1}], "unknown node field hangs"),
    ):
        with pytest.raises(ConfigError, match=complaint):
            parse_node({**doc, "hangs": hangs}, "n")
    assert load_node("dgx-a100").hangs == ()


def test_discovery_serves_a_gpu_stuck_midway_as_lost_with_what_it_read() -> None:
    from nvidia_device_plugin.nvml.discovery import discover

    with open_nvml("dgx-a100", call_timeout_s=NVML_CALL_DEADLINE_S) as session:
        assert session.simulator is not None
        session.simulator.hang("nvmlDeviceGetMigMode", 4)
        done: list[object] = []
        thread = threading.Thread(target=lambda: done.append(discover(session.nv, session.host.sysfs_root)))
        thread.start()
        wait_for(lambda: not thread.is_alive(), "discovery")
    (inventory,) = done
    gpu = inventory.gpus[4]  # type: ignore[attr-defined]
    assert gpu.lost and gpu.memory_bytes > 0 and gpu.minor == 4
    assert [g.index for g in inventory.gpus if g.lost] == [4]  # type: ignore[attr-defined]
    (problem,) = [p for p in inventory.problems if p.gpu_index == 4]  # type: ignore[attr-defined]
    assert "nvmlDeviceGetMigMode is stuck" in problem.message


def test_a_reload_with_a_gpu_stuck_midway_serves_it_as_before_and_lost() -> None:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.snapshot import build_snapshot

    with open_nvml("a100-mig-mixed", call_timeout_s=NVML_CALL_DEADLINE_S) as session:
        assert session.simulator is not None
        before = build_snapshot(session, Config()).inventory
        session.simulator.hang("nvmlDeviceGetMigMode", 0)  # after its memory, before its MIG devices
        after = build_snapshot(session, Config(), previous=before).inventory
        gpu = after.gpus[0]
        assert gpu.lost and gpu.mig_devices == before.gpus[0].mig_devices and gpu.mig_devices
        assert gpu == replace(before.gpus[0], lost=True)
        assert after.links == before.links
        assert [g for g in after.gpus[1:]] == list(before.gpus[1:])


def test_stop_can_interrupt_an_event_wait_through_the_bounded_api(session: NvmlSession) -> None:
    # BoundedNvml forwards the simulator's interrupt_event_wait through __getattr__, which a runtime
    # Protocol check does not see since Python 3.12: every monitor stop then waited out its event wait.
    _, uuid = _gpu(session, 0)
    event_set = nvml_events.create_event_set(session.nv)
    nvml_events.register_gpu(
        session.nv, event_set, uuid, nvml_events.event_mask(["EventTypeXidCriticalError"])
    )
    got: list[list[nvml_events.HealthEvent]] = []
    waiter = threading.Thread(
        target=lambda: got.append(nvml_events.wait_events(session.nv, event_set, 60_000, 8))
    )
    waiter.start()
    assert nvml_events.interrupt_wait(session.nv, event_set)  # the current wait or, if none yet, the next
    waiter.join(30)
    assert not waiter.is_alive() and got == [[]]
    nvml_events.free_event_set(session.nv, event_set)
