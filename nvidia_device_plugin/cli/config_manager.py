"""`config-manager`: NVIDIA's config-manager interface, run as an init container (ONESHOT) and a sidecar.

The GPU Operator execs `config-manager` from the device-plugin image; this is that command. Exit status: 0
after ONESHOT succeeded or after SIGTERM, 1 when ONESHOT could not link a config, 2 for bad settings.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from types import FrameType

from nvidia_device_plugin.configmanager.manager import ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import NodeApiError, api_client_from_environment
from nvidia_device_plugin.configmanager.settings import SettingsError, parse_settings

log = logging.getLogger("nvidia_device_plugin.configmanager")


class _Terminated(Exception):
    """Raised from the SIGTERM handler so that a blocking watch read ends at once (PEP 475)."""


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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
    manager = ConfigManager(settings, api_client)
    if settings.oneshot:
        return manager.run_once()
    stop = threading.Event()

    def terminate(signum: int, _frame: FrameType | None) -> None:
        stop.set()
        raise _Terminated(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, terminate)
    signal.signal(signal.SIGINT, terminate)
    try:
        manager.run(stop)
    except _Terminated as exc:
        log.info("config-manager: %s received, exiting", exc)
    return 0
