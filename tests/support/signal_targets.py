"""Processes a test starts to be signalled (or not): each records every SIGHUP in a file, says when its
handler is in place, and ends by itself within a minute even if the test forgets it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

_RECORDER = """
import signal, sys, time
path = sys.argv[1]
signal.signal(signal.SIGHUP, lambda *_: open(path, "a").write("hup\\n"))
print("ready", flush=True)
for _ in range(600):
    time.sleep(0.1)
"""


# The same, but it records a SIGHUP only when it came from the process whose PID is argv[2] or one of that
# process's descendants (the sender's ancestry read at once, while it still runs): a test session's decoy,
# which a stranger's signal (another session's config-manager on a shared machine) must not fail.
_SESSION_RECORDER = """
import os, signal, sys, time
path, session = sys.argv[1], int(sys.argv[2])
def sent_by_session(pid):
    for _ in range(64):
        if pid == session:
            return True
        try:
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return True  # gone already: it may have been ours (a ONESHOT run), so it counts
        if pid <= 1:
            return False
    return True
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
print("ready", flush=True)
deadline = time.monotonic() + 600
while time.monotonic() < deadline:
    info = signal.sigtimedwait({signal.SIGHUP}, 1.0)
    if info is not None and sent_by_session(info.si_pid):
        open(path, "a").write(f"hup from {info.si_pid}\\n")
"""


def start_recorder(script: Path, marker: Path, *, by_interpreter: bool = False) -> subprocess.Popen[str]:
    """Run a SIGHUP recorder from `script` (written here), once its handler is in place. Run as the plugin
    is (the script exec'd by its `#!` line) the kernel names the process after the script; `by_interpreter`
    (`python3 <script>`) names it after the interpreter, with the script's name only on its command line."""
    return _start(script, _RECORDER, [str(marker)], by_interpreter)


def start_session_decoy(script: Path, marker: Path) -> subprocess.Popen[str]:
    """A recorder (run as the plugin is) that records only the SIGHUPs this test process or its children
    send: see `_SESSION_RECORDER`."""
    return _start(script, _SESSION_RECORDER, [str(marker), str(os.getpid())], False)


def _start(script: Path, code: str, args: list[str], by_interpreter: bool) -> subprocess.Popen[str]:
    script.write_text(f"#!{sys.executable}\n{code}")
    os.chmod(script, 0o755)
    argv = [sys.executable, str(script), *args] if by_interpreter else [str(script), *args]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        process.wait()
        raise AssertionError(f"the signal recorder {script.name} did not start")
    return process


def signals_recorded(marker: Path) -> int:
    """How many SIGHUPs the recorder writing `marker` got."""
    return marker.read_text().count("hup") if marker.exists() else 0
