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


def start_recorder(script: Path, marker: Path, *, by_interpreter: bool = False) -> subprocess.Popen[str]:
    """Run a SIGHUP recorder from `script` (written here), once its handler is in place. Run as the plugin
    is (the script exec'd by its `#!` line) the kernel names the process after the script; `by_interpreter`
    (`python3 <script>`) names it after the interpreter, with the script's name only on its command line."""
    script.write_text(f"#!{sys.executable}\n{_RECORDER}")
    os.chmod(script, 0o755)
    argv = [sys.executable, str(script), str(marker)] if by_interpreter else [str(script), str(marker)]
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
