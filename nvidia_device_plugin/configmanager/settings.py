"""config-manager's settings: NVIDIA's flags and environment variables, with the same names and defaults.

Each setting is a flag with an environment variable behind it (flag > env > default), as in NVIDIA's
config-manager, so the GPU Operator's and NVIDIA's Helm chart's pod specs work unchanged. The defaults are
its binary's: SEND_SIGNAL true (SIGHUP to `nvidia-device-plugin`) and no fallback strategies; `named,single`
is only what NVIDIA's chart (and this one) set. Habits of NVIDIA's flag library (urfave/cli v2) are kept
because those pod specs rely on them: an empty environment variable for a number (`SIGNAL: ""`) means "not
set", so the default holds, while an empty one for a switch (`SEND_SIGNAL: ""`) means false; and switches may
be given bare (`--oneshot`) or with a value (`--oneshot=false`).
"""

from __future__ import annotations

import argparse
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.config.selection import (
    ConfigSelectionError,
    FallbackStrategy,
    parse_fallback_strategies,
)

DEFAULT_NODE_LABEL = "nvidia.com/device-plugin.config"
DEFAULT_PROCESS_TO_SIGNAL = "nvidia-device-plugin"
DEFAULT_SIGNAL = signal.SIGHUP
DEFAULT_SEND_SIGNAL = True  # NVIDIA's binary; its chart and this one set false in the init containers
DEFAULT_FALLBACK_STRATEGIES = ""  # none: without label and default, no config (exit 1 under ONESHOT)
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


class SettingsError(ConfigSelectionError):
    """A flag or environment variable has a value config-manager cannot use."""


@dataclass(frozen=True)
class Settings:
    node_name: str
    node_label: str
    config_file_srcdir: Path
    config_file_dst: Path
    default_config: str
    fallback_strategies: tuple[FallbackStrategy, ...]
    oneshot: bool
    send_signal: bool
    signal: int
    process_to_signal: str
    # --kubeconfig / KUBECONFIG; "" means: in a pod the service account, elsewhere ~/.kube/config
    kubeconfig: str = ""


def parse_bool(name: str, text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, got {text!r}")


def parse_signal(text: str) -> int:
    """`1`, `HUP` or `SIGHUP` -> 1 (NVIDIA passes the number); empty -> 1, the default, as NVIDIA's."""
    word = text.strip().upper() or str(int(DEFAULT_SIGNAL))
    if word.isdigit():
        number = int(word)
        if number in {s.value for s in signal.Signals}:
            return number
    else:
        name = word if word.startswith("SIG") else f"SIG{word}"
        if name in signal.Signals.__members__:
            return int(signal.Signals[name])
    raise SettingsError(f"SIGNAL must be a signal number or name such as 1 or SIGHUP, got {text!r}")


def _parser(environ: Mapping[str, str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="config-manager",
        description="Point the device plugin's config file at the config its node's label names, "
        "and keep it pointed there while the label changes.",
    )

    def option(flag: str, env: str, default: str, help_text: str) -> None:
        parser.add_argument(
            f"--{flag}", dest=env, default=environ.get(env, default), help=f"{help_text} [env {env}]"
        )

    def switch(flag: str, env: str, default: bool, help_text: str) -> None:
        # NVIDIA's boolean flags: `--oneshot` alone is true; `--oneshot=false` (or `--oneshot false`) false.
        # An empty variable is parsed (to false), as NVIDIA's flag library does; only an unset one is default.
        parser.add_argument(
            f"--{flag}",
            dest=env,
            nargs="?",
            const="true",
            default=environ.get(env, str(default).lower()),
            metavar="BOOL",
            help=f"{help_text} [env {env}]",
        )

    option("kubeconfig", "KUBECONFIG", "", "kubeconfig file; empty: the pod's service account")
    option("node-name", "NODE_NAME", "", "the node whose label is read (required)")
    option("node-label", "NODE_LABEL", DEFAULT_NODE_LABEL, "the label naming the config")
    option("config-file-srcdir", "CONFIG_FILE_SRCDIR", "", "directory holding one file per config (required)")
    option("config-file-dst", "CONFIG_FILE_DST", "", "the symlink the plugin reads (required)")
    option("default-config", "DEFAULT_CONFIG", "", "config used when the node has no label")
    option(
        "fallback-strategies",
        "FALLBACK_STRATEGIES",
        DEFAULT_FALLBACK_STRATEGIES,
        "what to use without label and default: named, single, empty, in order (default: none)",
    )
    switch("oneshot", "ONESHOT", False, "set the link once and exit (the init container)")
    switch(
        "send-signal",
        "SEND_SIGNAL",
        DEFAULT_SEND_SIGNAL,
        "signal the plugin after each change (default true; this plugin reloads by itself)",
    )
    option("signal", "SIGNAL", str(int(DEFAULT_SIGNAL)), "the signal to send (default 1, SIGHUP)")
    option("process-to-signal", "PROCESS_TO_SIGNAL", DEFAULT_PROCESS_TO_SIGNAL, "the process to signal")
    return parser


def parse_settings(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    values = vars(_parser(environ).parse_args(list(argv)))
    for required in ("NODE_NAME", "CONFIG_FILE_SRCDIR", "CONFIG_FILE_DST"):
        if not values[required].strip():
            flag = "--" + required.lower().replace("_", "-")
            raise SettingsError(f"{required} (or {flag}) must be set")
    node_label = values["NODE_LABEL"].strip()
    if not node_label:
        raise SettingsError("NODE_LABEL must not be empty")
    try:
        strategies = parse_fallback_strategies(values["FALLBACK_STRATEGIES"])
    except ConfigSelectionError as exc:
        raise SettingsError(str(exc)) from None
    return Settings(
        node_name=values["NODE_NAME"].strip(),
        node_label=node_label,
        config_file_srcdir=Path(values["CONFIG_FILE_SRCDIR"]),
        config_file_dst=Path(values["CONFIG_FILE_DST"]),
        default_config=values["DEFAULT_CONFIG"].strip(),
        fallback_strategies=strategies,
        oneshot=parse_bool("ONESHOT", values["ONESHOT"]),
        send_signal=parse_bool("SEND_SIGNAL", values["SEND_SIGNAL"]),
        signal=parse_signal(values["SIGNAL"]),
        process_to_signal=values["PROCESS_TO_SIGNAL"].strip() or DEFAULT_PROCESS_TO_SIGNAL,
        kubeconfig=values["KUBECONFIG"].strip(),
    )
