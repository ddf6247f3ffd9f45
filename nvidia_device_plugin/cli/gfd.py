"""`gpu-feature-discovery`: NVIDIA GFD's command line, labelling from this plugin's discovery.

Deployments that run NVIDIA's GFD v0.20 can run this image instead: the flags, environment variables and
config-file keys are GFD's (cli/gfd_settings.py lists them with their precedence), and so is the
behaviour (daemons/gfd.py, which this starts):

- labels go to NFD's NodeFeature API by default (`--use-node-feature-api`, GFD_USE_NODE_FEATURE_API or
  USE_NODE_FEATURE_API, `flags.useNodeFeatureAPI`): the object `nvidia-features-for-<node>` in
  `--namespace`/NAMESPACE (default `default`) for `--node-name`/NODE_NAME, owned by the DaemonSet of
  `--pod-name`/POD_NAME (labels/nodefeature.py); `--use-node-feature-api=false` writes NFD's features.d
  file (`--output-file`) instead;
- label, sleep `--sleep-interval` (`infinite`: label once and sleep), label again; SIGHUP reloads the config
  and labels at once, SIGTERM, SIGINT and SIGQUIT end the run; on exit the features.d file is removed
  unless `--oneshot`.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from functools import partial

from nvidia_device_plugin.base.logs import LOG_LEVELS, configure_logging
from nvidia_device_plugin.cli.common import env_value
from nvidia_device_plugin.cli.gfd_settings import (
    add_gfd_arguments,
    resolve_gfd_settings,
    with_gfd_env_aliases,
)
from nvidia_device_plugin.config.flags import add_config_arguments, resolve_config


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


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    env = with_gfd_env_aliases(os.environ if environ is None else environ)
    args = build_parser(env).parse_args(list(sys.argv[1:] if argv is None else argv))
    configure_logging(args.log_level, "text")
    from nvidia_device_plugin.cli.session import open_session
    from nvidia_device_plugin.daemons.gfd import (
        GfdConfig,
        GfdDaemon,
        GfdOptions,
        NodeFeatureTargetOptions,
        serve,
    )

    def load() -> GfdConfig:
        return GfdConfig(config=resolve_config(args, env), settings=resolve_gfd_settings(args, env))

    target = NodeFeatureTargetOptions(args.node_name, args.namespace, args.pod_name, args.kubeconfig)
    return serve(GfdDaemon(GfdOptions(load, partial(open_session, args.simulate), target)))
