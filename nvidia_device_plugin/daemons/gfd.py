"""`gpu-feature-discovery`'s daemon: label, sleep, label again, until a signal; SIGHUP relabels afresh.

NVIDIA's GFD v0.20 behaviour (cli/gfd.py parses its command line and starts this):

- one configuration (the plugin config and GFD's settings) is labelled by one `Labeller`, the worker
  ("gfd-labels") of the daemon's WorkerGroup: it opens NVML, labels, sleeps the sleep interval
  (`infinite`: labels once and sleeps), labels again; with `--oneshot` it labels once in its start;
- SIGHUP reloads the config and labels at once: the labeller of the old configuration is stopped and one
  for the new started in its place (the config-manager sidecar sends it; a config that does not load is
  logged and the one in use kept, where GFD exits); SIGTERM, SIGINT and SIGQUIT end the run;
- labels go to NFD's NodeFeature object, or to the features.d file, which is removed on exit unless
  `--oneshot` (the NodeFeature object is left to its owners), and on a reload that writes elsewhere.

Where GFD exits on a failed pass (NVML, the API server), this one logs the failure once per reason and tries
again at the next pass (a `--oneshot` run exits 1).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from nvidia_device_plugin.base.errors import DevicePluginError, NvmlError
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker, WorkerGroup
from nvidia_device_plugin.labels.node import TIMESTAMP_LABEL

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.labels.node import LabelSettings
    from nvidia_device_plugin.nvml.session import NvmlSession

log = logging.getLogger("gpu_feature_discovery")

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGQUIT})
SIGNALS = STOP_SIGNALS | {signal.SIGHUP}
Output = Callable[[dict[str, str]], str]  # writes the labels; returns what it did, for the log
_PASS = "labelling pass"  # the one failure a labeller keeps: the last pass's


class GfdSettings(Protocol):
    """GFD's own settings (cli/gfd_settings.py resolves them from flags, environment and config file)."""

    @property
    def oneshot(self) -> bool: ...
    @property
    def no_timestamp(self) -> bool: ...
    @property
    def sleep_interval(self) -> float | None: ...  # seconds; None: infinite
    @property
    def output_file(self) -> str: ...
    @property
    def machine_type_file(self) -> str: ...
    @property
    def use_node_feature_api(self) -> bool: ...


@dataclass(frozen=True)
class GfdConfig:
    """One configuration: the plugin config (MIG strategy, sharing) and GFD's own settings."""

    config: Config
    settings: GfdSettings


@dataclass(frozen=True)
class NodeFeatureTargetOptions:
    """Where the NodeFeature object goes (GFD's --node-name, --namespace, --pod-name, --kubeconfig)."""

    node_name: str | None
    namespace: str | None
    pod_name: str | None
    kubeconfig: str | None


@dataclass(frozen=True)
class GfdOptions:
    load: Callable[[], GfdConfig]  # read afresh at start and on each SIGHUP; DevicePluginError when bad
    open_nvml: Callable[[], NvmlSession]  # real or simulated (cli/ decides)
    node_feature: NodeFeatureTargetOptions


def serve(daemon: GfdDaemon) -> int:
    """Run `daemon` until SIGTERM, SIGINT or SIGQUIT (once with --oneshot), reloading it on SIGHUP; the
    exit status. The signals are blocked and taken by sigwaitinfo, never by a handler."""
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        daemon.start()
        while not daemon.oneshot:
            received = signal.sigwaitinfo(SIGNALS)
            log.info("received %s", signal.Signals(received.si_signo).name)
            if received.si_signo != signal.SIGHUP:
                break
            daemon.reload()
        daemon.stop()
        if not daemon.oneshot:
            daemon.remove_output()
        return 0
    except DevicePluginError as exc:
        daemon.stop()  # the output is left as it is, as GFD leaves it when it fails
        log.error("%s", exc)
        return 1
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)


class GfdDaemon:
    """Owns the labeller of the configuration in use (its WorkerGroup) and the output it writes."""

    def __init__(self, options: GfdOptions) -> None:
        self.options = options
        self.workers = WorkerGroup()
        self._loaded: GfdConfig | None = None
        self._labeller: Labeller | None = None
        self._remove_output: Callable[[], None] = _nothing

    @property
    def oneshot(self) -> bool:
        return self._loaded is not None and self._loaded.settings.oneshot

    def start(self) -> None:
        """Load the configuration and start labelling (label once, with --oneshot); DevicePluginError when
        the configuration does not load or nothing can be labelled."""
        self._loaded = self.options.load()
        self._labeller = self._labeller_for(self._loaded)
        self.workers.start(self._labeller)

    def reload(self) -> None:
        """Stop labelling, read the configuration again (a bad one is refused, naming the problem, and the
        one in use kept) and label with it at once."""
        old, loaded = self._labeller, self._loaded
        assert old is not None and loaded is not None, "reload before start"
        old.stop()
        log.info("SIGHUP: reloading the configuration and labelling again")
        try:
            reloaded = self.options.load()
        except DevicePluginError as exc:
            log.error("%s; labelling with the configuration in use", exc)
            reloaded = loaded
        # GFD removes its file at every SIGHUP and writes it again; kept here while it is still the
        # output, so NFD never misses it.
        if _target(reloaded.settings) != _target(loaded.settings):
            self._remove_output()
        self._loaded = reloaded
        self._labeller = self._labeller_for(reloaded)
        self.workers.replace(old, self._labeller)

    def stop(self) -> None:
        self.workers.stop_all()

    def remove_output(self) -> None:
        """Undo the output on exit: remove the features.d file (the NodeFeature object stays)."""
        self._remove_output()

    def _labeller_for(self, loaded: GfdConfig) -> Labeller:
        from nvidia_device_plugin.labels.nfd import read_machine_type
        from nvidia_device_plugin.labels.node import LabelSettings

        settings = loaded.settings
        output, self._remove_output = _output(self.options.node_feature, settings)
        labels_settings = LabelSettings(
            no_timestamp=settings.no_timestamp, machine_type=read_machine_type(settings.machine_type_file)
        )
        return Labeller(loaded, labels_settings, output, self.options.open_nvml)


class Labeller(Worker):
    """Labels one configuration: start() opens NVML (and with --oneshot labels once, raising
    DevicePluginError when that fails); its thread labels every sleep interval until stopped."""

    # A pass in flight when stop() comes (NVML, the API server within its own timeouts) is waited for: the
    # session is closed only once the pass is done.
    join_timeout_s = 60.0

    def __init__(
        self,
        loaded: GfdConfig,
        labels_settings: LabelSettings,
        output: Output,
        open_nvml: Callable[[], NvmlSession],
    ) -> None:
        super().__init__("gfd-labels")
        self._loaded = loaded
        self._labels_settings = labels_settings
        self._output = output
        self._open_nvml = open_nvml
        self._session: NvmlSession | None = None
        self._failures = FailureLog(log)
        self._written: dict[str, str] | None = None

    def setup(self) -> bool:
        self._session = self._open()
        if not self._loaded.settings.oneshot:
            return True
        self.label_once()
        return False

    def run(self, stop: threading.Event) -> None:
        interval = self._loaded.settings.sleep_interval
        while not stop.is_set():
            self.label_once()
            if interval is None:
                log.info("the sleep interval is infinite: labelled once, sleeping until a signal")
                stop.wait()
            else:
                stop.wait(interval)

    def cleanup(self) -> None:
        if self.alive:  # a pass stuck past join_timeout_s: its session is left to it, not closed under it
            return
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def label_once(self) -> None:
        """One pass; a failure is logged once per reason and tried again (raised, with --oneshot)."""
        try:
            labels = _labels(self._session, self._loaded.config, self._labels_settings)
            done = self._output(labels)
        except Exception as exc:  # the loop outlives any failure: logged once per reason, tried again
            reason = str(exc) or type(exc).__name__
            if self._loaded.settings.oneshot:
                raise exc if isinstance(exc, DevicePluginError) else DevicePluginError(reason) from exc
            unexpected = not isinstance(exc, DevicePluginError)
            self._failures.report(
                _PASS, f"{reason}; trying again in the next pass", logging.ERROR, unexpected
            )
            return
        if self._failures.clear(_PASS):
            log.info("labelling works again")
        stable = {k: v for k, v in labels.items() if k != TIMESTAMP_LABEL}
        if stable != self._written:
            log.info("%s: %d labels", done, len(labels))
            self._written = stable

    def _open(self) -> NvmlSession | None:
        try:
            return self._open_nvml()
        except NvmlError as exc:
            if self._loaded.config.flags.fail_on_init_error:
                raise
            log.error("%s; failOnInitError is false, so only the timestamp is labelled", exc)
            return None


def _nothing() -> None:
    pass


def _target(settings: GfdSettings) -> tuple[bool, str]:
    return settings.use_node_feature_api, settings.output_file


def _output(target: NodeFeatureTargetOptions, settings: GfdSettings) -> tuple[Output, Callable[[], None]]:
    """Where labels go, and what to undo on exit: the NodeFeature object, or the features.d file."""
    if settings.use_node_feature_api:
        return _node_feature_output(target), _nothing
    from nvidia_device_plugin.labels.nfd import render_features, write_features

    if not settings.output_file:  # as GFD: an empty output file means standard output

        def print_labels(labels: dict[str, str]) -> str:
            sys.stdout.write(render_features(labels))
            sys.stdout.flush()
            return "printed the labels"

        return print_labels, _nothing
    path = Path(settings.output_file)

    def write_file(labels: dict[str, str]) -> str:
        write_features(path, labels)
        return f"wrote {path}"

    def remove_file() -> None:
        log.info("exiting: removing %s", path)
        path.unlink(missing_ok=True)

    return write_file, remove_file


def _node_feature_output(options: NodeFeatureTargetOptions) -> Output:
    from nvidia_device_plugin.labels.nodefeature import (
        NodeFeaturePublisher,
        NodeFeatureTarget,
        api_client,
        owner_references,
    )

    if not options.node_name:
        raise DevicePluginError(
            "the NodeFeature API needs the node's name: set --node-name or NODE_NAME (the downward API's "
            "spec.nodeName), or write a features.d file with --use-node-feature-api=false"
        )
    if not options.namespace:
        raise DevicePluginError("the NodeFeature API needs a namespace: set --namespace or NAMESPACE")
    api = api_client(options.kubeconfig or "")
    target = NodeFeatureTarget(node_name=options.node_name, namespace=options.namespace)
    publisher = NodeFeaturePublisher(
        api, target, owner_references(api, options.namespace, options.pod_name or "")
    )

    def publish(labels: dict[str, str]) -> str:
        return f"{publisher.publish(labels)} {publisher.describe()}"

    return publish


def _labels(session: NvmlSession | None, config: Config, settings: LabelSettings) -> dict[str, str]:
    from nvidia_device_plugin.labels.node import node_labels
    from nvidia_device_plugin.snapshot import build_snapshot

    now = int(time.time())
    if session is None:
        return {} if settings.no_timestamp else {TIMESTAMP_LABEL: str(now)}
    snapshot = build_snapshot(session, config)
    return node_labels(snapshot.inventory, snapshot.config, (), settings, timestamp=now)
