"""The processes the benchmarks measure, and what /proc says about them.

* DaemonProcess: `python -m nvidia_device_plugin run --simulate NODE ...` in its own process, with a
  KubeletStandIn in this one as its kubelet.
* EchoServer: `python -m bench.echo_server SOCKET`, a bare grpcio DevicePlugin server (the reference);
  with `floor`, the same server doing what the plugin's dependencies cost (echo_server.py's `--floor`).
* `python -c pass`: what spawning any Python process costs.

Children get a minimal environment (no CONFIG_FILE, MIG_STRATEGY, ... from the caller's), so the flags the
benchmark passes are the whole configuration. Their output goes to a log file, never a pipe nobody reads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.config.loader import load_config_file
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.snapshot import build_snapshot
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

REPO_ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = REPO_ROOT / "bench"
NODES = BENCH_DIR / "nodes"
CONFIGS = BENCH_DIR / "configs"

_KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PYTHONPATH")
# The children's temporary files go to a memory filesystem unless the caller names a TMPDIR. A simulated
# node writes its sysfs, procfs and /dev tree and a fake driver root there (nvml/sim/host.py: about 200
# files and directories) before it serves: a stand-in for kernel filesystems that are in memory on a real
# node, where the plugin writes none of it. On a disk-backed /tmp those writes took 90-120 ms of a start-up
# of about 350 ms (several times that on a loaded machine), so the figure measured the disk, not the plugin.
# Unix sockets stay under /tmp (short_tmp_dir).
_MEMORY_TMPDIR = Path("/dev/shm")
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """A measured process did not do what the benchmark needs (start, register, answer)."""


def child_env() -> dict[str, str]:
    env = {k: os.environ[k] for k in _KEPT_ENV if k in os.environ}
    if "TMPDIR" not in env and _MEMORY_TMPDIR.is_dir() and os.access(_MEMORY_TMPDIR, os.W_OK | os.X_OK):
        env["TMPDIR"] = str(_MEMORY_TMPDIR)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    return env


def short_tmp_dir(tag: str) -> Path:
    """A fresh directory under /tmp: unix socket paths must stay under ~108 bytes."""
    return Path(tempfile.mkdtemp(prefix=f"nvdp-{tag}-", dir="/tmp"))


def node_path(name: str) -> str:
    """A bench/nodes file by stem, else the name itself (a preset such as dgx-a100)."""
    path = NODES / f"{name}.yaml"
    return str(path) if path.is_file() else name


def config_path(name: str | None) -> Path | None:
    return None if name is None else CONFIGS / f"{name}.yaml"


def expected_plans(node: str, config: str | None) -> tuple[ResourcePlan, ...]:
    """What the daemon will advertise for node + config, computed here with the same library code."""
    path = config_path(config)
    cfg = load_config_file(path) if path is not None else Config()
    session = open_nvml(node_path(node))
    try:
        return build_snapshot(session, cfg).plans
    finally:
        session.close()


# ---- /proc ------------------------------------------------------------------------------------------


def rss_mb(pid: int) -> float:
    """Resident set size (VmRSS) in MB (10^6 bytes)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 1e6
    raise BenchError(f"/proc/{pid}/status has no VmRSS line")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used, from /proc/<pid>/stat."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()  # after "pid (comm) ": fields from 3 (state) on
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLOCK_TICKS


# ---- python -c pass ---------------------------------------------------------------------------------


def python_pass_seconds() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True, env=child_env())
    return time.perf_counter() - started


def timed_command(args: Sequence[str]) -> float:
    """Wall time of one run of `python <args>` in the repo root, output discarded; fails on non-zero exit."""
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=child_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise BenchError(f"python {' '.join(args)} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return elapsed


# ---- processes with a lifetime ------------------------------------------------------------------------


def _stop(proc: subprocess.Popen[bytes], what: str, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL after `timeout`. False (and a warning) for a slow or unclean exit: a bug."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            print(f"bench: {what} ignored SIGTERM for {timeout:g} s; killed", file=sys.stderr)
            proc.kill()
            proc.wait()
            return False
    if proc.returncode != 0:
        print(f"bench: {what} exited with status {proc.returncode}", file=sys.stderr)
        return False
    return True


@dataclass
class EchoServer:
    proc: subprocess.Popen[bytes]
    socket: Path
    started_s: float  # spawn to "ready" (server started, socket bound)

    @property
    def pid(self) -> int:
        return self.proc.pid


@contextlib.contextmanager
def echo_server(floor: str | None = None) -> Iterator[EchoServer]:
    """A bare grpcio DevicePlugin server in another process; yields once it is serving. `floor` ("deps" or
    "config") adds the dependencies' share of a plugin's start (bench/echo_server.py)."""
    directory = short_tmp_dir("echo")
    socket = directory / "echo.sock"
    mode = {None: [], "deps": ["--floor"], "config": ["--floor=config"]}[floor]
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.echo_server", *mode, str(socket)],
        cwd=REPO_ROOT,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - started
        if line.strip() != b"ready":
            raise BenchError(
                f"echo server did not start: {line.decode()}{proc.stdout.read().decode()[-2000:]}"
            )
        yield EchoServer(proc, socket, elapsed)
    finally:
        _stop(proc, "echo server")
        if proc.stdout is not None:
            proc.stdout.close()
        shutil.rmtree(directory, ignore_errors=True)


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[bytes]
    kubelet: KubeletStandIn
    plugin_dir: Path
    plans: tuple[ResourcePlan, ...]
    events_file: Path | None
    log_file: Path
    spawned_at: float  # perf_counter() just before the spawn
    ready_at: float  # perf_counter() of the last first-ListAndWatch among all resources

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def resources(self) -> list[str]:
        return [p.name for p in self.plans]

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_tail_of(self.log_file, chars)

    @staticmethod
    def log_tail_of(log_file: Path, chars: int = 3000) -> str:
        try:
            return log_file.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def inject(self, line: str) -> None:
        """Append one JSON line to the --simulate-events file (one write, so never read half-written)."""
        if self.events_file is None:
            raise BenchError("this daemon was started without --simulate-events")
        fd = os.open(self.events_file, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line.encode() + b"\n")
        finally:
            os.close(fd)


@contextlib.contextmanager
def daemon_process(
    node: str,
    config: str | None = None,
    events: bool = False,
    timeout: float = 60.0,
    metrics_address: str = "",
) -> Iterator[DaemonProcess]:
    """Spawn the daemon on a simulated node with a kubelet stand-in; yields once every resource is listed.

    `metrics_address` (host:port) serves /metrics there; by default the daemon serves no HTTP."""
    plans = expected_plans(node, config)
    plugin_dir = short_tmp_dir("bench")
    log_file = plugin_dir / "daemon.log"
    kubelet = KubeletStandIn(plugin_dir)
    kubelet.start()
    args = [
        sys.executable,
        "-m",
        "nvidia_device_plugin",
        "run",
        "--simulate",
        node_path(node),
        "--device-plugin-path",
        str(plugin_dir),
        "--metrics-address",
        metrics_address,
    ]
    path = config_path(config)
    if path is not None:
        args += ["--config-file", str(path)]
    events_file = None
    if events:
        events_file = plugin_dir / "events.jsonl"
        events_file.touch()
        args += ["--simulate-events", str(events_file)]
    log = open(log_file, "wb")  # noqa: SIM115 - closed in the finally below, after the child exits
    proc: subprocess.Popen[bytes] | None = None
    try:
        spawned_at = time.perf_counter()
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        daemon = DaemonProcess(proc, kubelet, plugin_dir, plans, events_file, log_file, spawned_at, 0.0)
        names = daemon.resources
        if not kubelet.wait_for(lambda: proc.poll() is not None or _all_listed(kubelet, names), timeout):
            raise BenchError(
                f"{node}: resources {names} not registered in {timeout:g}s:\n{daemon.log_tail()}"
            )
        if proc.poll() is not None:
            raise BenchError(f"{node}: the daemon exited with {proc.returncode}:\n{daemon.log_tail()}")
        daemon.ready_at = max(kubelet.plugin(n).last_update for n in names)
        yield daemon
    finally:
        if proc is not None and not _stop(proc, f"daemon on {node}"):
            print(DaemonProcess.log_tail_of(log_file), file=sys.stderr)
        log.close()
        kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the daemon binds it a moment later; nothing else here does)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _all_listed(kubelet: KubeletStandIn, names: Sequence[str]) -> bool:
    """Every resource registered and its first ListAndWatch received (the stand-in's lock is re-entrant)."""
    registered = set(kubelet.resources())
    return all(n in registered and kubelet.plugin(n).updates > 0 for n in names)
