"""`config-manager`: NVIDIA's config-manager interface, run as an init container (ONESHOT) and a sidecar.

The GPU Operator execs `config-manager` from the device-plugin image; this is that command. Exit status: 0
after ONESHOT succeeded; 1, as NVIDIA's, when a config could not be linked (a label naming no config, no
config chosen, the API not answering) or SEND_SIGNAL found no process to signal, in ONESHOT and in the
sidecar alike; 2 for bad settings. SIGTERM or SIGINT ends
the sidecar as they end NVIDIA's Go binary (it installs no handler, so Go's runtime re-raises the signal):
the process dies of that signal, which the container runtime reports as 128 + its number (143 for SIGTERM).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

from nvidia_device_plugin.base.logs import TextFormatter
from nvidia_device_plugin.configmanager.manager import EMPTY_CONFIG_TARGET, ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import NodeApiError, api_client_from_environment
from nvidia_device_plugin.configmanager.settings import SettingsError, parse_settings

log = logging.getLogger("nvidia_device_plugin.configmanager")
_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Terminated(BaseException):
    """Raised from the SIGTERM/SIGINT handler so that a blocking API read ends at once (PEP 475). A
    BaseException, as KeyboardInterrupt is, so that the watching loop's `except Exception` (which keeps it
    going through odd API answers) lets a stop through instead of logging it as a failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, _frame: FrameType | None) -> None:
    raise _Terminated(signum)


def _die_of(signum: int) -> int:
    """End killed by `signum`, as NVIDIA's binary ends; 128 + `signum` as the exit status where that fails.

    It fails as PID 1 of a PID namespace (a container of a pod without shareProcessNamespace, as this chart
    renders it): the kernel drops a default-action signal that PID 1 sends itself. Go's runtime then exits 2;
    128 + signum is what a container runtime reports for the signal itself, so the status reads the same.
    """
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    return 128 + signum


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    _log_escaped()
    env = os.environ if environ is None else environ
    try:
        settings = parse_settings(sys.argv[1:] if argv is None else argv, env)
    except SettingsError as exc:
        log.error("config-manager: %s", exc)
        return 2
    try:
        api_client = api_client_from_environment(settings.kubeconfig)
    except NodeApiError as exc:
        log.error("config-manager: %s", exc)
        return 1
    # NVIDIA's: any config or signal failure exits 1; its `empty` fallback links /dev/null.
    manager = ConfigManager(settings, api_client, exit_on_error=True, empty_target=EMPTY_CONFIG_TARGET)
    if settings.oneshot:
        return manager.run_once()
    # Nothing sets the event: the handler's exception ends `run` wherever it waits (a read, a back-off).
    # Setting it from the handler could deadlock on the lock the interrupted wait holds.
    try:
        signal.signal(signal.SIGTERM, _terminate)
        signal.signal(signal.SIGINT, _terminate)
        return manager.run(threading.Event())
    except _Terminated as stop:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second stop signal must not interrupt the exit
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log.info("config-manager: %s received; stopping (%s left as it is)", stop, settings.config_file_dst)
        return _die_of(stop.signum)


def _log_escaped() -> None:
    """Log lines to stderr as before, through the daemon's formatter: control characters in what a line
    quotes (a label value, an API message) are escaped, so none can forge a line or reach a terminal."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter(_LOG_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
