"""The config-manager inside the plugin daemon, for clusters without NVIDIA's GPU Operator.

`run --node-config-label nvidia.com/device-plugin.config --config-dir /config` follows the node's label
the way the config-manager sidecar does, on a worker of the daemon ("node-label-watch"): it keeps a
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

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.config.selection import ConfigSelectionError, FallbackStrategy
from nvidia_device_plugin.config.source import ConfigSource
from nvidia_device_plugin.configmanager.link import LinkError
from nvidia_device_plugin.configmanager.manager import ConfigManager
from nvidia_device_plugin.configmanager.nodewatch import NodeApiError, api_client_from_environment
from nvidia_device_plugin.configmanager.settings import DEFAULT_PROCESS_TO_SIGNAL, Settings

log = logging.getLogger(__name__)

LINK_NAME = "config.yaml"


class NodeLabelConfig(Worker):
    """Keeps `config_file` pointed at the config the node's label chooses, until stopped.

    start() chooses once, in the caller's thread (as NVIDIA's init container does), then follows the label
    on the worker's thread; stop() ends the watch being read and removes the link directory.
    """

    join_timeout_s = 5.0  # a list request in flight when stop() comes ends within its own timeouts

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
        super().__init__("node-label-watch")
        self._link_dir = Path(tempfile.mkdtemp(prefix="nvdp-node-config-"))
        self.config_file = self._link_dir / LINK_NAME
        # What the daemon reads: the link, its configs' origin naming the file the label chose.
        self.source = ConfigSource.linked_by_label(self.config_file, label)
        self._settings = Settings(
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
        self._manager: ConfigManager | None = None

    def setup(self) -> bool:
        """The first choice. Raises ConfigError when it cannot be made (no API access, a label naming no
        config): the pod then fails and restarts, as it would with NVIDIA's init container."""
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
        return True

    def run(self, stop: threading.Event) -> None:
        if self._manager is not None:
            self._manager.run(stop)

    def wake(self) -> None:
        if self._manager is not None:
            self._manager.interrupt()

    def cleanup(self) -> None:
        shutil.rmtree(self._link_dir, ignore_errors=True)
