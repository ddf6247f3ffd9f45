"""The config-manager inside the plugin daemon, for clusters without NVIDIA's GPU Operator.

`run --node-config-label nvidia.com/device-plugin.config --config-dir /config` follows the node's label
the way the config-manager sidecar does, on a thread of the daemon ("node-label-watch"): it keeps a
symlink in a private directory pointed at the config the label names (NVIDIA's default and fallback
rules), and the daemon reads that link as its config file. A label change re-points the link; the
daemon's config watcher sees the change and reloads live, as for any edit. The Kubernetes API is read on
that thread only, never on the Allocate path; the pod needs `list` and `watch` on its own node.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

from nvidia_device_plugin.config.selection import ConfigSelectionError, FallbackStrategy
from nvidia_device_plugin.configmanager.link import LinkError
from nvidia_device_plugin.configmanager.manager import ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import NodeApiError, api_client_from_environment
from nvidia_device_plugin.configmanager.settings import DEFAULT_PROCESS_TO_SIGNAL, Settings
from nvidia_device_plugin.errors import ConfigError

log = logging.getLogger(__name__)

LINK_NAME = "config.yaml"


class NodeLabelConfig:
    """Keeps `config_file` pointed at the config the node's label chooses, until stopped."""

    def __init__(
        self,
        node_name: str,
        label: str,
        config_dir: Path,
        default_config: str,
        fallback_strategies: tuple[FallbackStrategy, ...],
        api_client: Any | None = None,
    ) -> None:
        if not node_name:
            raise ConfigError(
                f"--node-config-label {label} needs the node's name: set NODE_NAME (the downward API)"
            )
        self._link_dir = Path(tempfile.mkdtemp(prefix="nvdp-node-config-"))
        self.config_file = self._link_dir / LINK_NAME
        settings = Settings(
            node_name=node_name,
            node_label=label,
            config_file_srcdir=config_dir,
            config_file_dst=self.config_file,
            default_config=default_config,
            fallback_strategies=fallback_strategies,
            oneshot=False,
            send_signal=False,  # the daemon's config watcher sees the link change
            signal=1,
            process_to_signal=DEFAULT_PROCESS_TO_SIGNAL,
        )
        self._api_client = api_client
        self._settings = settings
        self._manager: ConfigManager | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Choose once now (as NVIDIA's init container does), then follow the label on a thread.

        Raises ConfigError when the first choice cannot be made (no API access, a label naming no
        config): the pod then fails and restarts, as it would with NVIDIA's init container.
        """
        try:
            client = self._api_client if self._api_client is not None else api_client_from_environment()
            self._manager = ConfigManager(self._settings, client)
            if self._manager.run_once() != 0:
                raise ConfigError(
                    f"cannot choose a config for node {self._settings.node_name} by its label "
                    f"{self._settings.node_label} (see the line above)"
                )
        except (NodeApiError, ConfigSelectionError, LinkError) as exc:
            shutil.rmtree(self._link_dir, ignore_errors=True)
            raise ConfigError(f"--node-config-label: {exc}") from exc
        except ConfigError:
            shutil.rmtree(self._link_dir, ignore_errors=True)
            raise
        self._thread = threading.Thread(target=self._manager.run, args=(self._stop,), name="node-label-watch")
        self._thread.daemon = True  # a watch read can block for minutes; stop() does not wait for it
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            # The watch read returns at the next event or its timeout; the thread ends then, on its own.
            self._thread.join(timeout=1.0)
        shutil.rmtree(self._link_dir, ignore_errors=True)
