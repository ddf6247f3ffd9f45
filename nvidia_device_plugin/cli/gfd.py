"""`gpu-feature-discovery`: NVIDIA GFD's command line, labelling from this plugin's discovery.

Deployments that run NVIDIA's GFD v0.20 can run this image instead: the flags, environment variables and
config-file keys are GFD's (cli/gfd_settings.py lists them with their precedence), and so is the
behaviour:

- labels go to NFD's NodeFeature API by default (`--use-node-feature-api`, GFD_USE_NODE_FEATURE_API or
  USE_NODE_FEATURE_API, `flags.useNodeFeatureAPI`): the object `nvidia-features-for-<node>` in
  `--namespace`/NAMESPACE (default `default`) for `--node-name`/NODE_NAME, owned by the DaemonSet of
  `--pod-name`/POD_NAME (labels/nodefeature.py); `--use-node-feature-api=false` writes NFD's features.d
  file (`--output-file`) instead;
- label, sleep `--sleep-interval` (`infinite`: label once and sleep), label again; SIGHUP reloads the config
  and labels at once (the config-manager sidecar sends it; a config that does not load is logged and the
  one in use kept, where GFD exits), SIGTERM, SIGINT and SIGQUIT end the run;
- on exit the features.d file is removed unless `--oneshot` (the NodeFeature object is left to its owners).

Where GFD exits on a failed pass (NVML, the API server), this one logs the failure once per reason and tries
again at the next pass (a `--oneshot` run exits 1).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from nvidia_device_plugin.base.errors import DevicePluginError, NvmlError
from nvidia_device_plugin.base.logs import LOG_LEVELS, FailureLog, configure_logging
from nvidia_device_plugin.cli.common import env_value
from nvidia_device_plugin.cli.gfd_settings import (
    GfdSettings,
    add_gfd_arguments,
    resolve_gfd_settings,
    with_gfd_env_aliases,
)
from nvidia_device_plugin.config.flags import add_config_arguments, resolve_config
from nvidia_device_plugin.labels.node import TIMESTAMP_LABEL

if TYPE_CHECKING:
    from nvidia_device_plugin.config.v1 import Config
    from nvidia_device_plugin.labels.node import LabelSettings
    from nvidia_device_plugin.nvml.session import NvmlSession

log = logging.getLogger("gpu_feature_discovery")

_STOP = {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT}
_SIGNALS = {signal.SIGHUP, *_STOP}
Output = Callable[[dict[str, str]], str]  # writes the labels; returns what it did, for the log
_PASS = "labelling pass"  # the one failure the loop keeps: the last pass's


def build_parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    def env(name: str, default: str | None = None) -> str | None:
        return env_value(environ, name, default)

    parser = argparse.ArgumentParser(
        prog="gpu-feature-discovery",
        description="Publish NVIDIA GPU Feature Discovery's node labels: NFD's NodeFeature object (the "
        "default) or a features.d file.",
    )
    add_gfd_arguments(parser)
    for flag, name, default, what in (
        ("--node-name", "NODE_NAME", None, "the node to label (required with the NodeFeature API)"),
        ("--namespace", "NAMESPACE", "default", "the namespace of the NodeFeature object (default default)"),
        ("--pod-name", "POD_NAME", None, "this pod, whose DaemonSet owns the NodeFeature object"),
        ("--kubeconfig", "KUBECONFIG", None, "a kubeconfig file (default: the pod's service account)"),
        ("--kube-api-qps", "KUBE_API_QPS", None, "accepted for GFD's command line; one request per pass"),
        ("--kube-api-burst", "KUBE_API_BURST", None, "accepted for GFD's command line"),
    ):
        parser.add_argument(flag, default=env(name, default), help=f"{what} [env {name}]")
    parser.add_argument(
        "--simulate",
        metavar="NODE",
        default=env("NVDP_SIMULATE"),
        help="label a simulated node (preset or YAML node file) [env NVDP_SIMULATE]",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=env("NVDP_LOG_LEVEL", "info"))
    add_config_arguments(parser)
    return parser


@dataclass(frozen=True)
class _Loaded:
    """One configuration: the plugin config (MIG strategy, sharing) and GFD's own settings."""

    config: Config
    settings: GfdSettings


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = with_gfd_env_aliases(os.environ if environ is None else environ)
    args = build_parser(env).parse_args(list(sys.argv[1:] if argv is None else argv))
    configure_logging(args.log_level, "text")
    handled = set(_SIGNALS)
    signal.pthread_sigmask(signal.SIG_BLOCK, handled)  # taken by sigtimedwait, never by a handler
    try:
        loaded = _load(args, env)
        while True:
            output, cleanup = _output(args, loaded.settings)
            if not _run(args, loaded, output):
                if not loaded.settings.oneshot:
                    cleanup()
                return 0
            reloaded = _reload(args, env, loaded)
            # GFD removes its file at every SIGHUP and writes it again; kept here while it is still the
            # output, so NFD never misses it.
            if _target(reloaded.settings) != _target(loaded.settings):
                cleanup()
            loaded = reloaded
    except DevicePluginError as exc:
        log.error("%s", exc)
        return 1
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, handled)


def _load(args: argparse.Namespace, env: Mapping[str, str]) -> _Loaded:
    return _Loaded(config=resolve_config(args, env), settings=resolve_gfd_settings(args, env))


def _reload(args: argparse.Namespace, env: Mapping[str, str], loaded: _Loaded) -> _Loaded:
    """The configuration after SIGHUP; a bad one is refused, naming the problem, and `loaded` kept."""
    log.info("SIGHUP: reloading the configuration and labelling again")
    try:
        return _load(args, env)
    except DevicePluginError as exc:
        log.error("%s; labelling with the configuration in use", exc)
        return loaded


def _target(settings: GfdSettings) -> tuple[bool, str]:
    return settings.use_node_feature_api, settings.output_file


def _run(args: argparse.Namespace, loaded: _Loaded, output: Output) -> bool:
    """Label every interval until a signal; True when SIGHUP asks for a reload."""
    from nvidia_device_plugin.labels.nfd import read_machine_type
    from nvidia_device_plugin.labels.node import LabelSettings

    settings = loaded.settings
    labels_settings = LabelSettings(
        no_timestamp=settings.no_timestamp, machine_type=read_machine_type(settings.machine_type_file)
    )
    session = _open(args.simulate, loaded.config)
    try:
        return _label_until_signal(session, loaded.config, labels_settings, settings, output)
    finally:
        if session is not None:
            session.close()


def _label_until_signal(
    session: NvmlSession | None,
    config: Config,
    labels_settings: LabelSettings,
    settings: GfdSettings,
    output: Output,
) -> bool:
    failures = FailureLog(log)
    written: dict[str, str] | None = None
    while True:
        try:
            labels = _labels(session, config, labels_settings)
            done = output(labels)
        except Exception as exc:  # the loop outlives any failure: logged once per reason, tried again
            reason = str(exc) or type(exc).__name__
            if settings.oneshot:
                raise exc if isinstance(exc, DevicePluginError) else DevicePluginError(reason) from exc
            unexpected = not isinstance(exc, DevicePluginError)
            failures.report(_PASS, f"{reason}; trying again in the next pass", logging.ERROR, unexpected)
        else:
            if failures.clear(_PASS):
                log.info("labelling works again")
            stable = {k: v for k, v in labels.items() if k != TIMESTAMP_LABEL}
            if stable != written:
                log.info("%s: %d labels", done, len(labels))
                written = stable
        if settings.oneshot:
            return False
        received = _sleep(settings.sleep_interval)
        if received is not None:
            log.info("received %s", signal.Signals(received.si_signo).name)
            return received.si_signo == signal.SIGHUP


def _sleep(interval: float | None) -> signal.struct_siginfo | None:
    """The signal that ended the sleep, or None when the interval passed."""
    if interval is None:
        log.info("the sleep interval is infinite: labelled once, sleeping until a signal")
        return signal.sigwaitinfo(_SIGNALS)
    return signal.sigtimedwait(_SIGNALS, interval)


def _output(args: argparse.Namespace, settings: GfdSettings) -> tuple[Output, Callable[[], None]]:
    """Where labels go, and what to undo on exit: the NodeFeature object, or the features.d file."""
    if settings.use_node_feature_api:
        return _node_feature_output(args), lambda: None
    from nvidia_device_plugin.labels.nfd import render_features, write_features

    if not settings.output_file:  # as GFD: an empty output file means standard output

        def print_labels(labels: dict[str, str]) -> str:
            sys.stdout.write(render_features(labels))
            sys.stdout.flush()
            return "printed the labels"

        return print_labels, lambda: None
    path = Path(settings.output_file)

    def write_file(labels: dict[str, str]) -> str:
        write_features(path, labels)
        return f"wrote {path}"

    def remove_file() -> None:
        log.info("exiting: removing %s", path)
        path.unlink(missing_ok=True)

    return write_file, remove_file


def _node_feature_output(args: argparse.Namespace) -> Output:
    from nvidia_device_plugin.labels.nodefeature import (
        NodeFeaturePublisher,
        NodeFeatureTarget,
        api_client,
        owner_references,
    )

    if not args.node_name:
        raise DevicePluginError(
            "the NodeFeature API needs the node's name: set --node-name or NODE_NAME (the downward API's "
            "spec.nodeName), or write a features.d file with --use-node-feature-api=false"
        )
    if not args.namespace:
        raise DevicePluginError("the NodeFeature API needs a namespace: set --namespace or NAMESPACE")
    api = api_client(args.kubeconfig or "")
    target = NodeFeatureTarget(node_name=args.node_name, namespace=args.namespace)
    publisher = NodeFeaturePublisher(api, target, owner_references(api, args.namespace, args.pod_name or ""))

    def publish(labels: dict[str, str]) -> str:
        return f"{publisher.publish(labels)} {publisher.describe()}"

    return publish


def _open(simulate: str | None, config: Config) -> NvmlSession | None:
    from nvidia_device_plugin.cli.session import open_session

    try:
        return open_session(simulate)
    except NvmlError as exc:
        if config.flags.fail_on_init_error:
            raise
        log.error("%s; failOnInitError is false, so only the timestamp is labelled", exc)
        return None


def _labels(session: NvmlSession | None, config: Config, settings: LabelSettings) -> dict[str, str]:
    from nvidia_device_plugin.labels.node import node_labels
    from nvidia_device_plugin.snapshot import build_snapshot

    now = int(time.time())
    if session is None:
        return {} if settings.no_timestamp else {TIMESTAMP_LABEL: str(now)}
    snapshot = build_snapshot(session, config)
    return node_labels(snapshot.inventory, snapshot.config, (), settings, timestamp=now)
