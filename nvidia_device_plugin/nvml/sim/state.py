"""The state and controls of a simulated node's NVML (not pynvml): injected events, lost GPUs, failures,
and hung calls.

A hung call blocks as a real driver's does during a GPU reset: `hang(name, gpu, seconds)` makes every call
of `name` on that GPU (or, with gpu None, every call of `name`) block until `seconds` have passed since
the hang was set, or, without seconds, until `release`. Node files set hangs from the simulator's start
(`hangs:` in nvml/sim/node.py), the events feed at run time (nvml/sim/events.py). close() releases them.

SimulatedNvml (nvml/sim/simulator.py) is this plus the pynvml functions, which live by job in devices.py,
mig.py, mig_management.py, topology.py and event_sets.py; each marks its functions with `pynvml_function`.
"""

from __future__ import annotations

import ctypes
import functools
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import pynvml

from nvidia_device_plugin.nvml.api import (
    DeviceHandle,
    EventSetHandle,
    PciInfo,
)
from nvidia_device_plugin.nvml.events import NOT_ATTRIBUTED
from nvidia_device_plugin.nvml.host import HostPaths
from nvidia_device_plugin.nvml.mig_profiles import profile_id_for
from nvidia_device_plugin.nvml.sim.gi_profiles import PLACEHOLDER_ID_OFFSET, GiProfile, profile_of
from nvidia_device_plugin.nvml.sim.host import materialize_host, mig_instance_ids
from nvidia_device_plugin.nvml.sim.node import NVSWITCH_PCI_DOMAIN, GpuSpec, MigSpec, NodeSpec
from nvidia_device_plugin.nvml.sim.timeslice import SimulatedTimeSlice

TIME_SLICES_FILE = "time-slices.json"  # in the host tree: the time-slices, for tests of a daemon process
_GPU_STRIDE = 0x10000
_MIG_STRIDE = 0x100
_EVENT_SET_BASE = 0x7F000000
_GPU_INSTANCE_BASE = 0x40000000  # + GPU index * 0x100 + GPU instance ID
_COMPUTE_INSTANCE_BASE = 0x50000000  # + GPU index * 0x1000 + GPU instance ID * 0x10 + compute instance ID


F = TypeVar("F", bound=Callable[..., Any])


def _nvml_error(code: int) -> pynvml.NVMLError:
    return pynvml.NVMLError(code)


def _address(handle: object) -> int:
    value = ctypes.cast(cast(Any, handle), ctypes.c_void_p).value
    if value is None:
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return value


@dataclass
class _Hang:
    """One hung call: blocks its callers until `until` (monotonic; None: until released)."""

    until: float | None
    released: threading.Event = field(default_factory=threading.Event)

    def block(self) -> None:
        timeout = None if self.until is None else max(self.until - time.monotonic(), 0.0)
        self.released.wait(timeout)


@dataclass(frozen=True)
class BareGpuInstance:
    """A GPU instance made at run time that has no compute instance (yet): it holds its memory slices, but
    no MIG device shows it (a MIG device is a compute instance)."""

    gi_id: int
    profile: GiProfile
    start: int


@dataclass
class _EventSet:
    """A simulated nvmlEventSet_t: its registrations and the events waiting."""

    address: int
    masks: dict[int, int] = field(default_factory=dict)  # GPU index -> registered event types
    queue: deque[tuple[int, int, int, int, int]] = field(default_factory=deque)
    woken: bool = False  # interrupt_event_wait was called: the next wait with nothing queued returns


class SimulatorState:
    """What the simulated driver knows beyond the node file, and the controls that change it."""

    def __init__(self, node: NodeSpec, *, lost_fails_event_wait: bool = False) -> None:
        self.node = node
        # Real drivers fail nvmlEventSetWait with GPU_IS_LOST while a registered GPU is lost.
        self.lost_fails_event_wait = lost_fails_event_wait
        self._persistent: dict[tuple[str, int | None], int] = {}  # (function, GPU index or None) -> code
        self._ecc_uncorrected: dict[int, int] = {}
        self._remapped: dict[int, tuple[int, int]] = {}  # GPU index -> (pending, failure)
        self._recovery_action: dict[int, int] = {}
        # Every GPU starts in DEFAULT; MIG devices have no compute mode of their own.
        self._compute_modes: dict[int, int] = {}
        self._lock = threading.RLock()
        self._events_ready = threading.Condition(self._lock)
        self._init_count = 0
        self._lost: set[int] = set()
        self._failures: dict[str, deque[int]] = {}
        self._event_sets: dict[int, _EventSet] = {}
        self._next_event_set = _EVENT_SET_BASE
        self._host_dir: tempfile.TemporaryDirectory[str] | None = None
        self._host: HostPaths | None = None
        self._hangs: dict[tuple[str, int | None], _Hang] = {}  # (function, GPU index or None: any)
        # MIG management (nvml/sim/mig_management.py): GPU index -> GI ID -> a GPU instance without a
        # compute instance; the MIG devices a process holds (their destroy answers IN_USE); how many made.
        self._bare_gpu_instances: dict[int, dict[int, BareGpuInstance]] = {}
        self._in_use: set[str] = set()
        self._made = 0
        # GPU index -> its NVLinks' remotes, made on first use: a node's links and PCI bus IDs never change
        # (a MIG edit replaces only MIG devices), and discovery asks for them per link, several times each.
        self._nvlink_remotes: dict[int, list[tuple[int, str]]] = {}
        # The GPUs' compute time-slices (nvidia-smi's, not NVML's: nvml/timeslice.py), kept in the host tree.
        self.time_slices = SimulatedTimeSlice([g.uuid for g in node.gpus])
        for spec in node.hangs:
            self.hang(spec.call, spec.gpu, spec.seconds)

    # ---- simulation controls (not pynvml) ---------------------------------------------------------

    def inject_xid(self, target: int | str, xid: int) -> None:
        self._inject(target, pynvml.nvmlEventTypeXidCriticalError, xid)

    def inject_ecc_double_bit(self, target: int | str) -> None:
        self._inject(target, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def set_lost(self, target: int | str, lost: bool) -> None:
        gpu, _ = self._resolve_target(target)
        with self._lock:
            if lost:
                self._lost.add(gpu.index)
            else:
                self._lost.discard(gpu.index)

    def fail_next(self, function_name: str, code: int, count: int = 1) -> None:
        self._check_function(function_name)
        with self._lock:
            self._failures.setdefault(function_name, deque()).extend([code] * count)

    def fail_always(self, function_name: str, code: int, gpu: int | None = None) -> None:
        """Every call of `function_name` (on GPU `gpu`, or on any device) fails with `code` until cleared.

        A call is "on GPU n" when its first argument is a handle of GPU n or of a MIG device on it.
        """
        self._check_function(function_name)
        with self._lock:
            self._persistent[(function_name, gpu)] = code

    def hang(self, function_name: str, target: int | str | None = None, seconds: float | None = None) -> None:
        """Calls of `function_name` on GPU `target` (any device and system calls: None) block for
        `seconds` from now, or until `release`."""
        self._check_function(function_name)
        gpu = None if target is None else self._resolve_target(target)[0].index
        with self._lock:
            old = self._hangs.get((function_name, gpu))
            until = None if seconds is None else time.monotonic() + seconds
            self._hangs[(function_name, gpu)] = _Hang(until)
        if old is not None:
            old.released.set()

    def release(self, function_name: str | None = None, target: int | str | None = None) -> None:
        """End the hangs of `function_name` on `target` (every hang: no arguments); blocked calls return."""
        gpu = None if target is None else self._resolve_target(target)[0].index
        with self._lock:
            keys = [k for k in self._hangs if function_name is None or k == (function_name, gpu)]
            hangs = [self._hangs.pop(k) for k in keys]
        for hang in hangs:
            hang.released.set()

    def set_in_use(self, mig_uuid: str, in_use: bool = True) -> None:
        """A process holds MIG device `mig_uuid` (or no longer does): destroying its compute instance
        answers NVML_ERROR_IN_USE, as the driver does while a CUDA context lives on it."""
        _, mig = self._resolve_target(mig_uuid)
        if mig is None:
            raise ValueError(f"{mig_uuid} is not a simulated MIG device")
        with self._lock:
            if in_use:
                self._in_use.add(mig_uuid)
            else:
                self._in_use.discard(mig_uuid)

    def clear_failures(self) -> None:
        with self._lock:
            self._persistent.clear()
            self._failures.clear()

    def set_ecc_uncorrected(self, target: int | str, count: int) -> None:
        """The volatile uncorrected ECC count nvmlDeviceGetTotalEccErrors reports for the GPU."""
        gpu, _ = self._resolve_target(target)
        with self._lock:
            self._ecc_uncorrected[gpu.index] = count

    def set_remapped_rows(self, target: int | str, pending: bool, failure: bool) -> None:
        gpu, _ = self._resolve_target(target)
        with self._lock:
            self._remapped[gpu.index] = (int(pending), int(failure))

    def set_recovery_action(self, target: int | str, action: int) -> None:
        """NVML_FI_DEV_GET_GPU_RECOVERY_ACTION of the GPU (0: none needed)."""
        gpu, _ = self._resolve_target(target)
        with self._lock:
            self._recovery_action[gpu.index] = action

    def interrupt_event_wait(self, eventSet: EventSetHandle) -> None:
        """Make a wait on `eventSet` with nothing queued return NVML_ERROR_TIMEOUT now (or the next one).

        Not pynvml: real nvmlEventSetWait cannot be interrupted. It lets a monitor stop without waiting
        out its timeout; see nvml/events.py:interrupt_wait.
        """
        with self._events_ready:
            event_set = self._event_sets.get(_address(eventSet))
            if event_set is not None:
                event_set.woken = True
                self._events_ready.notify_all()

    def materialize_host(self) -> HostPaths:
        """A throwaway sysfs, procfs and /dev tree for this node (see nvml/sim/host.py); made once."""
        with self._lock:
            if self._host is None:
                self._host_dir = tempfile.TemporaryDirectory(prefix="nvdp-host-")
                self._host = materialize_host(self.node, Path(self._host_dir.name))
                self.time_slices.record_to(Path(self._host_dir.name) / TIME_SLICES_FILE)
            return self._host

    def close(self) -> None:
        self.release()
        with self._lock:
            if self._host_dir is not None:
                self._host_dir.cleanup()
                self._host_dir = None
                self._host = None

    # ---- internals ----------------------------------------------------------------------------

    def _check_function(self, function_name: str) -> None:
        if not getattr(getattr(type(self), function_name, None), "pynvml_api", False):
            raise ValueError(f"{function_name} is not a simulated pynvml function")

    def _call_gpu(self, name: str, first_arg: object) -> int | None:
        """The GPU index a call is on: its handle's (a GPU's or a MIG device's), its index, its UUID."""
        if isinstance(first_arg, pynvml.c_nvmlDevice_t):
            return (ctypes.cast(first_arg, ctypes.c_void_p).value or 0) // _GPU_STRIDE - 1
        if isinstance(first_arg, pynvml.c_nvmlGpuInstance_t):
            return ((ctypes.cast(first_arg, ctypes.c_void_p).value or 0) - _GPU_INSTANCE_BASE) // 0x100
        if isinstance(first_arg, pynvml.c_nvmlComputeInstance_t):
            return ((ctypes.cast(first_arg, ctypes.c_void_p).value or 0) - _COMPUTE_INSTANCE_BASE) // 0x1000
        if name == "nvmlDeviceGetHandleByIndex" and isinstance(first_arg, int):
            return first_arg
        if name == "nvmlDeviceGetHandleByUUID" and isinstance(first_arg, str | bytes):
            text = first_arg.decode() if isinstance(first_arg, bytes) else first_arg
            for gpu in self.node.gpus:
                if text == gpu.uuid or any(text == m.uuid for m in gpu.mig):
                    return gpu.index
        return None

    def _hang_of(self, name: str, first_arg: object) -> _Hang | None:
        if not self._hangs:
            return None
        hang = self._hangs.get((name, None)) or self._hangs.get((name, self._call_gpu(name, first_arg)))
        if hang is not None and hang.until is not None and hang.until <= time.monotonic():
            return None
        return hang

    def _maybe_fail(self, name: str, first_arg: object) -> None:
        pending = self._failures.get(name)
        if pending:
            raise _nvml_error(pending.popleft())
        if not self._persistent:
            return
        code = self._persistent.get((name, None))
        if code is None:
            code = self._persistent.get((name, self._call_gpu(name, first_arg)))
        if code is not None:
            raise _nvml_error(code)

    @staticmethod
    def _profile_info_id(gpu: GpuSpec, mig: MigSpec) -> int:
        """NVIDIA's profile ID of `mig`'s GPU instance (nvml/sim/gi_profiles.py); outside its tables, the
        profile index offset by PLACEHOLDER_ID_OFFSET (never one of NVIDIA's)."""
        profile = profile_of(gpu, mig)
        if profile is not None:
            return profile.info_id
        return profile_id_for(mig.gpu_slices, mig.suffix) + PLACEHOLDER_ID_OFFSET

    @staticmethod
    def _gi_handle_address(gpu: GpuSpec, gi_id: int) -> int:
        return _GPU_INSTANCE_BASE + gpu.index * 0x100 + gi_id

    def _gpu_instance(self, handle: object) -> tuple[GpuSpec, int]:
        """The GPU and GPU instance ID a GPU-instance handle names (INVALID_ARGUMENT for garbage)."""
        gpu_index, gi_id = divmod(_address(handle) - _GPU_INSTANCE_BASE, 0x100)
        if not 0 <= gpu_index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._check_not_lost(gpu_index)
        return self.node.gpus[gpu_index], gi_id

    def _instance_of(self, gpu: GpuSpec, gi_id: int) -> tuple[MigSpec | None, BareGpuInstance | None]:
        """GPU instance `gi_id` of `gpu`: its MIG device, or the bare instance; (None, None): none such."""
        mig = next((m for m in gpu.mig if mig_instance_ids(gpu, m)[0] == gi_id), None)
        with self._lock:
            bare = self._bare_gpu_instances.get(gpu.index, {}).get(gi_id)
        return mig, bare

    def _check_not_lost(self, index: int) -> None:
        if index in self._lost:
            raise _nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)

    @staticmethod
    def _handle(address: int) -> DeviceHandle:
        return DeviceHandle(ctypes.cast(address, pynvml.c_nvmlDevice_t))

    def _device(self, handle: DeviceHandle) -> tuple[GpuSpec, MigSpec | None]:
        address = _address(handle)
        gpu_index = address // _GPU_STRIDE - 1
        mig_index = (address % _GPU_STRIDE) // _MIG_STRIDE - 1
        if not 0 <= gpu_index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.node.gpus[gpu_index]
        with self._lock:
            self._check_not_lost(gpu_index)
        if mig_index < 0:
            return gpu, None
        mig = next((m for m in gpu.mig if m.slot == mig_index), None)
        if mig is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, mig

    def _event_set(self, handle: EventSetHandle) -> _EventSet:
        event_set = self._event_sets.get(_address(handle))
        if event_set is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return event_set

    def _resolve_target(self, target: int | str) -> tuple[GpuSpec, MigSpec | None]:
        for gpu in self.node.gpus:
            if target in (gpu.index, gpu.uuid, str(gpu.index)):
                return gpu, None
            for mig in gpu.mig:
                if target == mig.uuid:
                    return gpu, mig
        raise ValueError(f"no simulated GPU or MIG device {target!r} on node {self.node.name}")

    def _inject(self, target: int | str, event_type: int, data: int) -> None:
        gpu, mig = self._resolve_target(target)
        gi, ci = mig_instance_ids(gpu, mig) if mig else (NOT_ATTRIBUTED, NOT_ATTRIBUTED)
        with self._events_ready:
            for event_set in self._event_sets.values():
                if event_set.masks.get(gpu.index, 0) & event_type:
                    event_set.queue.append((gpu.index, event_type, data, gi, ci))
            self._events_ready.notify_all()

    @staticmethod
    def _mig_memory_mb(gpu: GpuSpec, mig: MigSpec) -> int:
        # Slightly below the nominal share, as real MIG slices are; the profile name rounds it back up.
        total_gb = -(-gpu.memory_mib // 1024)
        return int(mig.memory_gb / total_gb * gpu.memory_mib * 0.97)

    def _link_targets(self, gpu: GpuSpec) -> list[tuple[int, str]]:
        """Per NVLink of `gpu`: (remote device type, remote PCI bus ID)."""
        targets = self._nvlink_remotes.get(gpu.index)
        if targets is None:
            targets = self._nvlink_remotes[gpu.index] = self._nvlink_remotes_of(gpu)
        return targets

    def _nvlink_remotes_of(self, gpu: GpuSpec) -> list[tuple[int, str]]:
        targets: list[tuple[int, str]] = []
        for a, b, lanes in self.node.nvlinks:
            if gpu.index in (a, b):
                peer = self.node.gpus[b if gpu.index == a else a]
                targets += [(pynvml.NVML_NVLINK_DEVICE_TYPE_GPU, peer.pci_bus_id)] * lanes
        for k in range(self.node.nvswitch_links):
            # Six NVSwitches, as on DGX A100/H100, in a PCI domain no GPU may use (node.py checks).
            switch_bus = f"{NVSWITCH_PCI_DOMAIN.upper()}:{k % 6:02X}:00.0"
            targets.append((pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH, switch_bus))
        return targets

    @staticmethod
    def _pci_info(bus_id: str) -> PciInfo:
        info: Any = pynvml.nvmlPciInfo_t()  # sets fields PciInfo does not name
        domain, bus, rest = bus_id.split(":")
        info.busId = bus_id.encode()
        info.busIdLegacy = bus_id[4:].encode()
        info.domain = int(domain, 16)
        info.bus = int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        pci: PciInfo = info
        return pci


def pynvml_function(fn: F) -> F:
    """Marks a pynvml function of the simulator: blocks while the call is hung (outside the lock, as
    other calls go on), applies injected failures and checks init under the lock, then calls it outside
    the lock."""

    @functools.wraps(fn)
    def wrapper(self: SimulatorState, *args: Any, **kwargs: Any) -> Any:
        first = args[0] if args else None
        with self._lock:
            hang = self._hang_of(fn.__name__, first)
        if hang is not None:
            hang.block()
        with self._lock:
            self._maybe_fail(fn.__name__, first)
            if fn.__name__ != "nvmlInit" and self._init_count == 0:
                raise _nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)
        return fn(self, *args, **kwargs)

    wrapper.__dict__["pynvml_api"] = True
    return wrapper  # type: ignore[return-value]
