"""Every child process the package starts, started one way: with a clean signal state and bounded.

The daemons block SIGHUP, SIGINT and SIGTERM in every thread (signals.py takes them with sigwait), and a
child inherits the signal mask of the thread that starts it, across exec: a control daemon started that
way shows `SigBlk: 0x4003` in /proc/<pid>/status, and `kill -TERM` leaves it running. subprocess cannot
reset a mask (its preexec_fn is unsafe in a threaded process), so children start through posix_spawn,
which empties the mask and sets every signal's disposition back to the default before exec (Python
ignores SIGPIPE; an ignored signal would stay ignored across exec too).

A child writes its output to an unlinked temporary file, not a pipe: a child that daemonises keeps its
descriptors, and a pipe would not see EOF until that daemon exits. Only the first `max_output` bytes
are read back. `wait` ends at a deadline or when a stop event is set; a child still running then is
killed (SIGKILL) and reaped, so nothing waits on a hung child for longer than its bound.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO

MAX_OUTPUT_BYTES = 4096  # of a child's output, kept for messages; the rest is counted, never read
# Every catchable signal goes back to its default disposition in the child.
_DEFAULT_SIGNALS = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
_POLL_MIN_S = 0.001
_POLL_MAX_S = 0.05
_REAP_WAIT_S = 1.0
_unreaped: set[int] = set()  # killed children not reaped yet (stuck in the kernel when killed)
_unreaped_lock = threading.Lock()


@dataclass(frozen=True)
class Outcome:
    """How a child ended: its exit status (None when it was killed at its bound) and what it wrote."""

    returncode: int | None
    output: str  # the first max_output bytes, decoded, stripped; "... (N more bytes)" when cut
    why_killed: str = ""  # "timed out after 10s", "stopping"; empty when it exited by itself


class Child:
    """One started child: wait for it (bounded), kill it, read what it wrote."""

    def __init__(self, pid: int, output: IO[bytes], argv0: str) -> None:
        self.pid = pid
        self.argv0 = argv0
        self._output = output
        self._returncode: int | None = None

    def wait(self, deadline: float, stop: threading.Event | None = None) -> bool:
        """Whether the child exited before `deadline` (time.monotonic) and before `stop` was set."""
        delay = _POLL_MIN_S
        while self.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (stop is not None and stop.is_set()):
                return False
            pause = min(delay, remaining)
            if stop is not None:
                stop.wait(pause)
            else:
                time.sleep(pause)
            delay = min(delay * 2, _POLL_MAX_S)
        return True

    def poll(self) -> int | None:
        if self._returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == self.pid:
                self._returncode = os.waitstatus_to_exitcode(status)
        return self._returncode

    def kill(self) -> None:
        """SIGKILL the child (not what it started) and reap it; one stuck in the kernel (a driver call)
        is reaped later, by the next start()."""
        if self.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        if not self.wait(time.monotonic() + _REAP_WAIT_S):
            with _unreaped_lock:
                _unreaped.add(self.pid)

    def outcome(self, max_output: int = MAX_OUTPUT_BYTES, why_killed: str = "") -> Outcome:
        """What the child wrote (bounded) and how it ended; closes its output file."""
        try:
            size = os.fstat(self._output.fileno()).st_size
            self._output.seek(0)
            head = self._output.read(max_output)
        finally:
            self._output.close()
        text = head.decode(errors="replace").strip()
        if size > len(head):
            text += f"... ({size - len(head)} more bytes not shown)"
        return Outcome(None if why_killed else self._returncode, text, why_killed)


def start(argv: Sequence[str], env: Mapping[str, str], stdin: bytes | None = None) -> Child:
    """Start `argv` (argv[0] looked up on env's PATH) with `env`, `stdin` on its standard input (or
    /dev/null) and its output to a temporary file. Raises OSError (FileNotFoundError naming argv[0])."""
    _reap_killed()
    path = shutil.which(argv[0], path=env.get("PATH", os.defpath))
    if path is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), argv[0])
    output = tempfile.TemporaryFile()  # noqa: SIM115 - the Child owns it; outcome() closes it
    try:
        stdin_fd = _stdin(stdin)
        try:
            pid = os.posix_spawn(
                path,
                list(argv),
                dict(env),
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, stdin_fd, 0),
                    (os.POSIX_SPAWN_DUP2, output.fileno(), 1),
                    (os.POSIX_SPAWN_DUP2, output.fileno(), 2),
                ],
                setsigmask=(),
                setsigdef=_DEFAULT_SIGNALS,
            )
        finally:
            os.close(stdin_fd)
    except BaseException:
        output.close()
        raise
    return Child(pid, output, argv[0])


def run(
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    timeout_s: float,
    stdin: bytes | None = None,
    stop: threading.Event | None = None,
    max_output: int = MAX_OUTPUT_BYTES,
) -> Outcome:
    """Start `argv`, wait at most `timeout_s` (or until `stop` is set), kill it if it is still running."""
    child = start(argv, env, stdin)
    if child.wait(time.monotonic() + timeout_s, stop):
        return child.outcome(max_output)
    child.kill()
    why = "stopping" if stop is not None and stop.is_set() else f"timed out after {timeout_s:g}s"
    return child.outcome(max_output, why)


def _reap_killed() -> None:
    with _unreaped_lock:
        for pid in list(_unreaped):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done == pid:
                _unreaped.discard(pid)


def _stdin(data: bytes | None) -> int:
    """A descriptor to give the child as its standard input: `data` in a pipe, else /dev/null."""
    if data is None:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    if len(data) > 4096:  # PIPE_BUF: written at once, before the child runs, never blocking
        raise ValueError("a child's standard input is limited to 4096 bytes")
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, data)
    finally:
        os.close(write_end)
    return read_end
