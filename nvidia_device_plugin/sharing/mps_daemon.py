"""MPS control daemons: one `nvidia-cuda-mps-control -d` per shared GPU, supervised and restarted.

Each runs with `CUDA_VISIBLE_DEVICES` set to its GPU alone. NVIDIA's plugin runs one daemon per resource
instead. One per GPU is used here for two reasons. An MPS server that hits a fatal fault takes all its
clients down, and with one daemon per GPU that is one GPU's clients, not the whole node's. And with a
single visible GPU the daemon's device ordinal 0 always means that GPU, so the pinned-memory limit lands on
the right device. The price: a container's MPS replicas must all be on one GPU, since it has one pipe
directory per resource (serving/allocate.py refuses a request that spans GPUs). Paths and limits come from
sharing/mps.py; readiness is published through sharing/readiness.py. This supervisor runs inside the
`mps-control-daemon` command (mps_control.py, cli/mps_control.py), never inside the device plugin.
"""

from __future__ import annotations

import logging
import os
import posixpath
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.boundedio import SMALL_FILE_BYTES, read_text
from nvidia_device_plugin.errors import DevicePluginError
from nvidia_device_plugin.logs import FailureLog
from nvidia_device_plugin.resources import ResourcePlan
from nvidia_device_plugin.sharing import CONTROL_EXECUTABLE
from nvidia_device_plugin.sharing.mps import (
    active_thread_percentage,
    host_log_dir,
    host_pipe_dir,
    pinned_memory_limit_mib,
)
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, status_path, write_status
from nvidia_device_plugin.workers import Worker

log = logging.getLogger(__name__)

PID_FILE = "nvidia-cuda-mps-control.pid"  # written by the control daemon into its pipe directory


@dataclass(frozen=True)
class MpsDaemonSpec:
    """One control daemon: the shared GPU it serves and the limits it hands to its clients."""

    resource_name: str
    gpu_uuid: str
    pipe_dir: str
    log_dir: str
    status_path: str
    pinned_memory_limit_mib: int
    active_thread_percentage: int

    def env(self) -> dict[str, str]:
        return {
            "CUDA_VISIBLE_DEVICES": self.gpu_uuid,
            "CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir,
            "CUDA_MPS_LOG_DIRECTORY": self.log_dir,
        }

    def setup_commands(self) -> tuple[str, ...]:
        """Control commands that set the client defaults; device 0 is the only GPU the daemon sees."""
        return (
            f"set_default_device_pinned_mem_limit 0 {self.pinned_memory_limit_mib}M",
            f"set_default_active_thread_percentage {self.active_thread_percentage}",
        )

    @property
    def label(self) -> str:
        return f"GPU {self.gpu_uuid} ({self.resource_name})"


def daemon_specs(plan: ResourcePlan, mps_root: str) -> tuple[MpsDaemonSpec, ...]:
    """One daemon per device that `plan` shares with MPS, in plan order; none for other plans."""
    if plan.sharing != "mps":
        return ()
    specs: dict[str, MpsDaemonSpec] = {}
    for dev in plan.devices:
        if dev.replica is None or dev.physical_uuid in specs:
            continue
        replicas = plan.replicas
        specs[dev.physical_uuid] = MpsDaemonSpec(
            resource_name=plan.name,
            gpu_uuid=dev.physical_uuid,
            pipe_dir=host_pipe_dir(mps_root, plan.name, dev.physical_uuid),
            log_dir=host_log_dir(mps_root, plan.name, dev.physical_uuid),
            status_path=status_path(mps_root, plan.name, dev.physical_uuid),
            pinned_memory_limit_mib=pinned_memory_limit_mib(dev.memory_bytes, replicas),
            active_thread_percentage=active_thread_percentage(replicas),
        )
    return tuple(specs.values())


Hook = Callable[[MpsDaemonSpec], None]


@dataclass
class _DaemonState:
    spec: MpsDaemonSpec
    pid: int | None = None  # of the running daemon, once seen
    prepared: bool = False  # the GPU was made ready for MPS (compute mode)
    configured: bool = False  # the client defaults were set in the running daemon
    failures: int = 0  # consecutive failed starts or deaths; sets the backoff
    next_attempt: float = 0.0  # monotonic time before which no start or setup is tried
    ready_since: float = 0.0
    published: GpuMpsStatus | None = None  # what the status file says now


class MpsDaemonSupervisor(Worker):
    """Keeps one MPS control daemon running per GPU it is given, restarting dead ones, publishing readiness.

    `nvidia-cuda-mps-control -d` forks the daemon and returns, so the daemon is not our child. It is
    found through the pid file it writes into its pipe directory. That also lets a restarted supervisor
    adopt the daemons still running from its predecessor instead of starting a second set.

    `update(specs)` says which daemons are wanted: new ones start, kept ones keep running (their client
    defaults are sent again if the limits changed), and only the ones no longer wanted get `quit`, as
    `echo quit | nvidia-cuda-mps-control` does. `stop()` never quits a daemon: clients keep running while
    the supervisor is away, and the status files keep saying what they said. `prepare` runs before a
    GPU's daemon is started or adopted (compute mode), `release` after it was quit; either raises
    DevicePluginError to say it failed. The checks run on the supervisor's thread ("mps-supervisor").
    """

    def __init__(
        self,
        *,
        control_path: str = CONTROL_EXECUTABLE,
        prepare: Hook = lambda spec: None,
        release: Hook = lambda spec: None,
        base_env: Mapping[str, str] | None = None,
        check_interval_s: float = 1.0,
        start_timeout_s: float = 10.0,
        command_timeout_s: float = 10.0,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        super().__init__("mps-supervisor")
        self.join_timeout_s = 3 * command_timeout_s + 5.0  # a check runs up to three control commands
        self._states: dict[str, _DaemonState] = {}  # by pipe directory
        self._control_path = control_path
        self._prepare = prepare
        self._release = release
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._check_interval_s = check_interval_s
        self._start_timeout_s = start_timeout_s
        self._command_timeout_s = command_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()  # one state is checked, or the wanted set changed, at a time
        self._wake = threading.Event()
        self._failures = FailureLog(log)  # a check that raised, a status file not written; per pipe dir

    def update(self, specs: Sequence[MpsDaemonSpec]) -> None:
        """Supervise exactly `specs` from now on; quit (and release) the daemons no longer wanted."""
        wanted = {spec.pipe_dir: spec for spec in specs}
        with self._lock:
            for pipe_dir in [p for p in self._states if p not in wanted]:
                self._retire(self._states.pop(pipe_dir))
            for pipe_dir, spec in wanted.items():
                state = self._states.get(pipe_dir)
                if state is None:
                    self._states[pipe_dir] = _DaemonState(spec)
                elif state.spec != spec:
                    log.info("MPS limits of %s changed; setting the client defaults again", spec.label)
                    state.spec = spec
                    state.configured = False
                    state.next_attempt = 0.0
        self._wake.set()

    def statuses(self) -> dict[str, GpuMpsStatus | None]:
        """What each supervised daemon's status file says now, by GPU UUID (None: not checked yet)."""
        with self._lock:
            return {s.spec.gpu_uuid: s.published for s in self._states.values()}

    def wake(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._lock:
                states = list(self._states.values())
            for state in states:
                if stop.is_set():
                    return
                with self._lock:
                    if self._states.get(state.spec.pipe_dir) is state:
                        try:
                            self._check(state)
                        except Exception as exc:  # a bug or an odd OS answer must not end supervision
                            self._check_failed(state, exc)
            self._wake.wait(self._check_interval_s)
            self._wake.clear()

    def _check_failed(self, state: _DaemonState, exc: Exception) -> None:
        self._failures.report(
            f"check {state.spec.pipe_dir}",
            f"checking the MPS control daemon for {state.spec.label} failed "
            f"({type(exc).__name__}: {exc}); retrying",
            logging.ERROR,
            exc_info=True,
        )
        self._failed(state, time.monotonic())

    def _check(self, state: _DaemonState) -> None:
        spec = state.spec
        now = time.monotonic()
        pid = running_pid(spec.pipe_dir)
        if pid is not None and state.pid is not None and pid != state.pid:
            log.warning("MPS control daemon for %s was replaced (pid %d, now %d)", spec.label, state.pid, pid)
            state.configured = False
        if pid is None and state.pid is not None:
            log.warning("MPS control daemon for %s (pid %d) exited", spec.label, state.pid)
            self._publish(state, False, f"control daemon (pid {state.pid}) exited")
            state.pid = None
            state.configured = False
            self._failed(state, now)
        if now < state.next_attempt:
            return
        if not state.prepared:
            try:
                self._prepare(spec)
            except DevicePluginError as exc:
                log.error("MPS control daemon for %s not started: %s", spec.label, exc)
                self._publish(state, False, str(exc))
                self._failed(state, now)
                return
            state.prepared = True
        if pid is None:
            pid, problem = self._launch(spec)
            if pid is None:
                self._publish(state, False, problem)
                self._failed(state, now)
                return
        elif state.pid is None:
            log.info("MPS control daemon for %s already running (pid %d); adopting it", spec.label, pid)
        state.pid = pid
        if not state.configured:
            for command in spec.setup_commands():
                ok, output = self._send(spec, command)
                if not ok:
                    log.warning("MPS control daemon for %s refused %r: %s", spec.label, command, output)
                    self._publish(state, False, f"control daemon refused {command!r}: {output}")
                    self._failed(state, now)
                    return
            state.configured = True
            state.ready_since = now
            log.info(
                "MPS control daemon ready for %s (pid %d, pinned memory %d MiB, active threads %d%%)",
                spec.label,
                pid,
                spec.pinned_memory_limit_mib,
                spec.active_thread_percentage,
            )
        elif state.failures and now - state.ready_since >= self._backoff_max_s:
            state.failures = 0
        self._publish(state, True, "running")

    def _publish(self, state: _DaemonState, ready: bool, reason: str) -> None:
        spec = state.spec
        status = GpuMpsStatus(
            ready=ready,
            reason=reason,
            pid=state.pid if ready else None,
            pinned_memory_limit_mib=spec.pinned_memory_limit_mib,
            active_thread_percentage=spec.active_thread_percentage,
        )
        if status == state.published:
            return
        try:
            write_status(spec.status_path, status)
        except OSError as exc:  # tried again at every check: logged once per reason
            why = f"cannot write {spec.status_path}: {exc.strerror or exc}"
            self._failures.report(
                f"publish {spec.pipe_dir}", f"MPS control daemon for {spec.label}: {why}", logging.ERROR
            )
            return
        self._failures.clear(f"publish {spec.pipe_dir}")
        state.published = status

    def _retire(self, state: _DaemonState) -> None:
        """Quit a daemon that is no longer wanted, give its GPU back, and withdraw its status file."""
        spec = state.spec
        self._failures.clear(f"check {spec.pipe_dir}")
        self._failures.clear(f"publish {spec.pipe_dir}")
        Path(spec.status_path).unlink(missing_ok=True)  # first, so no client is sent to a daemon going away
        pid = running_pid(spec.pipe_dir)
        if pid is not None:
            ok, output = self._send(spec, "quit")
            if not ok:
                log.warning("MPS control daemon for %s did not take 'quit': %s", spec.label, output)
            elif self._wait_gone(pid):
                log.info("MPS control daemon for %s stopped (pid %d): no longer shared", spec.label, pid)
            else:
                log.warning("MPS control daemon for %s (pid %d) still running after 'quit'", spec.label, pid)
        try:
            self._release(spec)
        except DevicePluginError as exc:
            log.error("%s: %s", spec.label, exc)

    def _failed(self, state: _DaemonState, now: float) -> None:
        state.failures += 1
        delay = min(self._backoff_initial_s * 2 ** (state.failures - 1), self._backoff_max_s)
        state.next_attempt = now + delay
        log.info("MPS control daemon for %s: next attempt in %.1fs", state.spec.label, delay)

    def _launch(self, spec: MpsDaemonSpec) -> tuple[int | None, str]:
        """Start the daemon: its pid once its pid file names a live process, else None and why not."""
        try:
            for directory in (spec.pipe_dir, spec.log_dir):
                os.makedirs(directory, mode=0o755, exist_ok=True)
            Path(spec.pipe_dir, PID_FILE).unlink(missing_ok=True)  # stale: its process is gone
        except OSError as exc:
            log.error("MPS control daemon for %s: cannot prepare %s: %s", spec.label, spec.pipe_dir, exc)
            return None, f"cannot prepare {spec.pipe_dir}: {exc}"
        log.info("Starting MPS control daemon for %s", spec.label)
        ok, output = self._execute(spec, ["-d"], stdin=None)
        if not ok:
            log.error("MPS control daemon for %s failed to start: %s", spec.label, output)
            return None, f"failed to start {self._control_path}: {output}"
        deadline = time.monotonic() + self._start_timeout_s
        while True:
            pid = running_pid(spec.pipe_dir)
            if pid is not None:
                return pid, ""
            if self.stopping.wait(0.02):
                return None, "supervisor stopping"  # a successor adopts it if it came up
            if time.monotonic() >= deadline:
                break
        pid_file = posixpath.join(spec.pipe_dir, PID_FILE)
        problem = f"wrote no live pid to {pid_file} within {self._start_timeout_s:.0f}s"
        log.error("MPS control daemon for %s %s", spec.label, problem)
        return None, problem

    def _send(self, spec: MpsDaemonSpec, command: str) -> tuple[bool, str]:
        return self._execute(spec, [], stdin=command + "\n")

    def _execute(self, spec: MpsDaemonSpec, args: list[str], stdin: str | None) -> tuple[bool, str]:
        # Output goes to a file, not a pipe: a daemonising child that keeps the pipe open would make
        # us wait for EOF until it exits.
        env = {**self._base_env, **spec.env()}
        with tempfile.TemporaryFile() as out:
            try:
                proc = subprocess.run(
                    [self._control_path, *args],
                    input=None if stdin is None else stdin.encode(),
                    stdin=subprocess.DEVNULL if stdin is None else None,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    timeout=self._command_timeout_s,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                return False, str(exc)
            out.seek(0)
            output = out.read().decode(errors="replace").strip()
        if proc.returncode != 0:
            return False, f"exit status {proc.returncode}: {output}"
        return True, output

    def _wait_gone(self, pid: int) -> bool:
        deadline = time.monotonic() + self._command_timeout_s
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True


def running_pid(pipe_dir: str) -> int | None:
    """The pid in the daemon's pid file, if that process is alive."""
    try:
        pid = int(read_text(Path(pipe_dir, PID_FILE), SMALL_FILE_BYTES).strip())
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: beyond pid_t, so no such process
        return False
    except PermissionError:
        return True
    # A killed daemon whose parent has not reaped it yet still answers kill(0): look at its state.
    try:
        stat = read_text(f"/proc/{pid}/stat", SMALL_FILE_BYTES, errors="replace")
    except OSError:
        return True
    fields = stat.rpartition(")")[2].split()
    return not fields or fields[0] not in ("Z", "X")
