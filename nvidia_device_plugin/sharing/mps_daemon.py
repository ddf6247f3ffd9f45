"""MPS control daemons: one `nvidia-cuda-mps-control -d` per shared GPU, supervised and restarted.

Each runs with `CUDA_VISIBLE_DEVICES` set to its GPU alone. NVIDIA's plugin runs one daemon per resource
instead. One per GPU is used here for two reasons. An MPS server that hits a fatal fault takes all its
clients down, and with one daemon per GPU that is one GPU's clients, not the whole node's. And with a
single visible GPU the daemon's device ordinal 0 always means that GPU, so the pinned-memory limit lands on
the right device. The price: a container's MPS replicas must all be on one GPU, since it has one pipe
directory per resource (serving/allocate.py refuses a request that spans GPUs). Paths and limits come from
sharing/mps.py (per daemon: sharing/mps_specs.py); readiness is published through sharing/readiness.py;
its processes are found and quit through sharing/mps_processes.py, and every control command is a child
started by children.py (a clean signal mask, a deadline, bounded output). This supervisor runs inside the
`mps-control-daemon` command (mps_control.py, cli/mps_control.py), never inside the device plugin.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.base import children
from nvidia_device_plugin.base.errors import DevicePluginError
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.sharing import CONTROL_EXECUTABLE, QUIT_TIMEOUT_S
from nvidia_device_plugin.sharing.mps_processes import (
    PID_FILE,
    DaemonProcess,
    QuitTarget,
    is_control_daemon,
    live_process,
    quit_daemons,
    restore_pid_file,
    running_pid,
)
from nvidia_device_plugin.sharing.mps_specs import MpsDaemonSpec, daemon_specs
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, read_status, write_status

__all__ = ["PID_FILE", "MpsDaemonSpec", "MpsDaemonSupervisor", "daemon_specs", "running_pid"]

log = logging.getLogger(__name__)

Hook = Callable[[MpsDaemonSpec], None]


@dataclass
class _DaemonState:
    spec: MpsDaemonSpec
    daemon: DaemonProcess | None = None  # the running daemon, once seen: the supervisor's own record
    prepared: bool = False  # the GPU was made ready for MPS (compute mode)
    configured: bool = False  # the client defaults were set in the running daemon
    failures: int = 0  # consecutive failed starts or deaths; sets the backoff
    next_attempt: float = 0.0  # monotonic time before which no start or setup is tried
    ready_since: float = 0.0
    published: GpuMpsStatus | None = None  # what the status file says now

    @property
    def pid(self) -> int | None:
        return self.daemon.pid if self.daemon is not None else None


class MpsDaemonSupervisor(Worker):
    """Keeps one MPS control daemon running per GPU it is given, restarting dead ones, publishing readiness.

    `nvidia-cuda-mps-control -d` forks the daemon and returns, so the daemon is not our child. It is
    found through the pid file it writes into its pipe directory (or, for a successor when a tenant deleted
    that file, through the pid in the status file), which lets a restarted supervisor adopt the daemons
    still running from its predecessor instead of starting a second set. Once found, the process itself is
    followed (sharing/mps_processes.py): a pid file a tenant deletes or replaces is written again, and
    never makes a running daemon count as gone.

    `update(specs)` says which daemons are wanted: new ones start, kept ones keep running (their client
    defaults are sent again if the limits changed), and only the ones no longer wanted get `quit`, as
    `echo quit | nvidia-cuda-mps-control` does, all at once and within `quit_timeout_s` in all. `stop()`
    never quits a daemon: clients keep running while the supervisor is away, and the status files keep
    saying what they said; it ends any control command under way at once. `prepare` runs before a GPU's
    daemon is started or adopted (compute mode), `release` after it was quit; either raises
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
        quit_timeout_s: float = QUIT_TIMEOUT_S,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        super().__init__("mps-supervisor")
        # A control command ends when stop() is asked; `prepare` (an NVML call) has a deadline of its own.
        self.join_timeout_s = command_timeout_s + 5.0
        self._states: dict[str, _DaemonState] = {}  # by pipe directory
        self._control_path = control_path
        self._prepare = prepare
        self._release = release
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._check_interval_s = check_interval_s
        self._start_timeout_s = start_timeout_s
        self._command_timeout_s = command_timeout_s
        self._quit_timeout_s = quit_timeout_s
        self._backoff_initial_s = backoff_initial_s
        self._backoff_max_s = backoff_max_s
        self._lock = threading.Lock()  # one state is checked, or the wanted set changed, at a time
        self._wake = threading.Event()
        self._failures = FailureLog(log)  # a check that raised, a status file not written; per pipe dir

    def update(self, specs: Sequence[MpsDaemonSpec]) -> None:
        """Supervise exactly `specs` from now on; quit (and release) the daemons no longer wanted."""
        wanted = {spec.pipe_dir: spec for spec in specs}
        with self._lock:
            self._retire([self._states.pop(p) for p in list(self._states) if p not in wanted])
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
        self._follow(state, now)
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
        if state.daemon is None:
            daemon, problem = self._launch(spec)
            if daemon is None:
                self._publish(state, False, problem)
                self._failed(state, now)
                return
            state.daemon = daemon
        if not state.configured:
            if not self._configure(state, now):
                return
        elif state.failures and now - state.ready_since >= self._backoff_max_s:
            state.failures = 0
        self._publish(state, True, "running")

    def _follow(self, state: _DaemonState, now: float) -> None:
        """Bring `state.daemon` up to date: the one it knows while that process runs (its pid file
        restored if a tenant took it), else whichever control daemon the pipe directory has now."""
        spec, known = state.spec, state.daemon
        if known is not None and known.still_running():
            self._keep_pid_file(state, known)
            return
        found = self._find(spec)
        if known is not None and found is None:
            log.warning("MPS control daemon for %s (pid %d) exited", spec.label, known.pid)
            self._publish(state, False, f"control daemon (pid {known.pid}) exited")
            state.configured = False
            self._failed(state, now)
        elif known is not None and found is not None:
            log.warning(
                "MPS control daemon for %s was replaced (pid %d, now %d)", spec.label, known.pid, found.pid
            )
            state.configured = False
        elif found is not None:
            log.info("MPS control daemon for %s already running (pid %d); adopting it", spec.label, found.pid)
        state.daemon = found
        if found is not None:
            self._keep_pid_file(state, found)  # adopted through the status file: the pid file again

    def _find(self, spec: MpsDaemonSpec) -> DaemonProcess | None:
        """The daemon its pid file names; else the one our status file named, if it still is one."""
        pid = running_pid(spec.pipe_dir)
        if pid is None:
            pid = read_status(spec.status_path).pid
            if pid is None or not is_control_daemon(pid, self._control_path, spec.pipe_dir):
                return None
        return live_process(pid)

    def _keep_pid_file(self, state: _DaemonState, daemon: DaemonProcess) -> None:
        spec = state.spec
        if running_pid(spec.pipe_dir) == daemon.pid:
            return
        try:
            restore_pid_file(spec.pipe_dir, daemon.pid)
        except OSError as exc:
            self._failures.report(
                f"pid {spec.pipe_dir}",
                f"MPS control daemon for {spec.label}: cannot restore its pid file: {exc.strerror or exc}",
            )
            return
        self._failures.clear(f"pid {spec.pipe_dir}")
        log.warning(
            "MPS control daemon for %s: its pid file was removed or changed (by a client?); the daemon "
            "(pid %d) still runs, and the file says so again",
            spec.label,
            daemon.pid,
        )

    def _configure(self, state: _DaemonState, now: float) -> bool:
        """Send the client defaults; False (published, backing off) when the daemon refused one."""
        spec = state.spec
        for command in spec.setup_commands():
            ok, output = self._send(spec, command)
            if not ok:
                log.warning("MPS control daemon for %s refused %r: %s", spec.label, command, output)
                self._publish(state, False, f"control daemon refused {command!r}: {output}")
                self._failed(state, now)
                return False
        state.configured = True
        state.ready_since = now
        log.info(
            "MPS control daemon ready for %s (pid %s, %s, active threads %d%%)",
            spec.label,
            state.pid,
            f"pinned memory {spec.pinned_memory_limit_mib} MiB"
            if spec.pinned_memory_limit_mib
            else "no pinned-memory limit: the GPU's memory is not known",
            spec.active_thread_percentage,
        )
        return True

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

    def _retire(self, states: Sequence[_DaemonState]) -> None:
        """Quit the daemons no longer wanted (all at once, bounded), give their GPUs back, and withdraw
        their status files."""
        targets: list[QuitTarget] = []
        for state in states:
            spec = state.spec
            for key in ("check", "publish", "pid"):
                self._failures.clear(f"{key} {spec.pipe_dir}")
            Path(spec.status_path).unlink(missing_ok=True)  # first: no client is sent to a daemon going away
            known = state.daemon if state.daemon is not None and state.daemon.still_running() else None
            daemon = known or self._find(spec)
            if daemon is not None:
                targets.append(QuitTarget(spec, daemon.pid))
        results = self._quit(targets)
        for target in targets:
            problem = results[target.spec.pipe_dir]
            if problem:
                log.warning("MPS control daemon for %s (pid %d) %s", target.spec.label, target.pid, problem)
            else:
                log.info(
                    "MPS control daemon for %s stopped (pid %d): no longer shared",
                    target.spec.label,
                    target.pid,
                )
        for state in states:
            try:
                self._release(state.spec)
            except DevicePluginError as exc:
                log.error("%s: %s", state.spec.label, exc)

    def _quit(self, targets: Sequence[QuitTarget]) -> dict[str, str]:
        if not targets:
            return {}
        return quit_daemons(targets, self._control_path, self._base_env, self._quit_timeout_s, self.stopping)

    def _failed(self, state: _DaemonState, now: float) -> None:
        state.failures += 1
        delay = min(self._backoff_initial_s * 2 ** (state.failures - 1), self._backoff_max_s)
        state.next_attempt = now + delay
        log.info("MPS control daemon for %s: next attempt in %.1fs", state.spec.label, delay)

    def _launch(self, spec: MpsDaemonSpec) -> tuple[DaemonProcess | None, str]:
        """Start the daemon: its process once its pid file names a live one, else None and why not."""
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
            daemon = live_process(pid) if pid is not None else None
            if daemon is not None:
                return daemon, ""
            if self.stopping.wait(0.02):
                return None, "supervisor stopping"  # a successor adopts it if it came up
            if time.monotonic() >= deadline:
                break
        pid_file = os.path.join(spec.pipe_dir, PID_FILE)
        problem = f"wrote no live pid to {pid_file} within {self._start_timeout_s:.0f}s"
        log.error("MPS control daemon for %s %s", spec.label, problem)
        return None, problem

    def _send(self, spec: MpsDaemonSpec, command: str) -> tuple[bool, str]:
        return self._execute(spec, [], stdin=command + "\n")

    def _execute(self, spec: MpsDaemonSpec, args: list[str], stdin: str | None) -> tuple[bool, str]:
        """Run the control binary (bounded by command_timeout_s, ended by stop()); (ok, its output)."""
        env = {**self._base_env, **spec.env()}
        try:
            outcome = children.run(
                [self._control_path, *args],
                env,
                timeout_s=self._command_timeout_s,
                stdin=None if stdin is None else stdin.encode(),
                stop=self.stopping,
            )
        except OSError as exc:
            return False, str(exc)
        if outcome.why_killed:
            return False, f"{self._control_path} {outcome.why_killed}: {outcome.output}"
        if outcome.returncode != 0:
            return False, f"exit status {outcome.returncode}: {outcome.output}"
        return True, outcome.output
