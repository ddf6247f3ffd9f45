"""`gpu-feature-discovery` as GFD v0.20 runs: its flags, variables and `flags.gfd.*` config keys with GFD's
precedence (flag > env > file > default), `--sleep-interval infinite`, SIGHUP reloads, SIGTERM ends.

These runs write NFD's features.d file (`--use-node-feature-api=false`); the NodeFeature API, GFD v0.20's
default, is in test_nodefeature.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from nvidia_device_plugin.cli.gfd import build_parser
from nvidia_device_plugin.cli.gfd import main as gfd_main
from nvidia_device_plugin.cli.gfd_settings import GfdSettings, resolve_gfd_settings, with_gfd_env_aliases
from nvidia_device_plugin.labels.nfd import DEFAULT_OUTPUT_FILE, parse_features

from support.labels_file import read_labels
from support.waiting import CHILD_GUARD_S, scaled, wait_for

N = "nvidia.com/"
FILE_OUTPUT = {"GFD_USE_NODE_FEATURE_API": "false"}


def settings(argv: list[str], env: dict[str, str]) -> GfdSettings:
    return resolve_gfd_settings(build_parser(env).parse_args(argv), env)


def test_gfd_oneshot_with_gfd_env(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    env = {
        "GFD_ONESHOT": "true",
        "GFD_OUTPUT_FILE": str(out),
        "GFD_NO_TIMESTAMP": "true",
        "GFD_MACHINE_TYPE_FILE": "",
        "MIG_STRATEGY": "mixed",
        "NVDP_SIMULATE": "h100-nvl",
        **FILE_OUTPUT,
    }
    assert gfd_main([], env) == 0
    labels = read_labels(out)
    assert labels[N + "mig.strategy"] == "mixed"
    assert labels[N + "mig-3g.47gb.count"] == "1"
    assert N + "gfd.timestamp" not in labels


def test_gfd_refuses_bad_flags(tmp_path: Path) -> None:
    base = ["--simulate", "t4-single", "--output-file", str(tmp_path / "f"), "--oneshot"]
    assert gfd_main([*base, "--sleep-interval", "soon"], FILE_OUTPUT) == 1
    assert gfd_main([*base, "--no-timestamp", "maybe"], FILE_OUTPUT) == 1
    assert not (tmp_path / "f").exists()


def test_an_empty_output_file_prints_the_labels(capsys: pytest.CaptureFixture[str]) -> None:
    assert gfd_main(["--simulate", "t4-single", "--oneshot", "-o", ""], FILE_OUTPUT) == 0
    assert parse_features(capsys.readouterr().out)[N + "gpu.product"] == "Tesla-T4"


def test_the_defaults_are_gfds() -> None:
    assert settings([], {}) == settings([], {"GFD_SLEEP_INTERVAL": ""})  # empty counts as unset
    s = settings([], {})
    assert (s.oneshot, s.no_timestamp, s.sleep_interval, s.use_node_feature_api) == (False, False, 60.0, True)
    assert s.output_file == DEFAULT_OUTPUT_FILE
    assert s.machine_type_file == "/sys/class/dmi/id/product_name"


def test_flags_gfd_in_the_config_file_are_honoured(tmp_path: Path) -> None:
    out, machine, config = tmp_path / "labels", tmp_path / "product_name", tmp_path / "config.yaml"
    machine.write_text("Standard PC (Q35 + ICH9, 2009)\n")
    config.write_text(
        "version: v1\n"
        "flags:\n"
        "  useNodeFeatureAPI: false\n"
        f"  gfd: {{oneshot: true, noTimestamp: true, outputFile: {out}, machineTypeFile: {machine}}}\n"
    )
    # oneshot from the file: the run returns (it would sleep otherwise)
    assert gfd_main(["--simulate", "t4-single", "--config-file", str(config)], {}) == 0
    labels = read_labels(out)
    assert labels[N + "gpu.machine"] == "Standard-PC-Q35-ICH9-2009"
    assert N + "gfd.timestamp" not in labels


def test_precedence_is_flag_then_env_then_file_then_default(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags: {gfd: {outputFile: /from/file, sleepInterval: 90s}}\n")
    file_only = ["--config-file", str(config)]
    env = {"GFD_OUTPUT_FILE": "/from/env"}
    assert settings(file_only, {}).output_file == "/from/file"
    assert settings(file_only, env).output_file == "/from/env"
    assert settings([*file_only, "-o", "/from/flag"], env).output_file == "/from/flag"
    assert settings([], {}).output_file == DEFAULT_OUTPUT_FILE
    assert settings(file_only, {}).sleep_interval == 90.0
    assert settings([*file_only, "--sleep-interval", "2m"], {}).sleep_interval == 120.0


def test_sleep_interval_forms(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags: {gfd: {sleepInterval: 30000000000}}\n")  # Go nanoseconds
    assert settings(["--config-file", str(config)], {}).sleep_interval == 30.0
    assert settings(["--sleep-interval", "infinite"], {}).sleep_interval is None
    assert settings([], {"GFD_SLEEP_INTERVAL": "infinite"}).sleep_interval is None
    config.write_text("version: v1\nflags: {gfd: {sleepInterval: infinite}}\n")
    assert settings(["--config-file", str(config)], {}).sleep_interval is None


def test_use_node_feature_api_from_either_variable_or_the_file(tmp_path: Path) -> None:
    assert settings([], {"USE_NODE_FEATURE_API": "false"}).use_node_feature_api is False
    both = {"GFD_USE_NODE_FEATURE_API": "true", "USE_NODE_FEATURE_API": "false"}
    assert settings([], both).use_node_feature_api is True  # the first one wins
    assert settings(["--use-node-feature-api=false"], both).use_node_feature_api is False
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags: {useNodeFeatureAPI: false}\n")
    assert settings(["--config-file", str(config)], {}).use_node_feature_api is False


def test_gfd_spellings_of_the_shared_variables_win(tmp_path: Path) -> None:
    env = with_gfd_env_aliases(
        {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "single", "GFD_CONFIG_FILE": "/c"}
    )
    assert (env["MIG_STRATEGY"], env["CONFIG_FILE"]) == ("mixed", "/c")
    out = tmp_path / "labels"
    run_env = {"GFD_MIG_STRATEGY": "mixed", "MIG_STRATEGY": "none", **FILE_OUTPUT}
    assert gfd_main(["--simulate", "a100-mig-mixed", "--oneshot", "-o", str(out)], run_env) == 0
    assert read_labels(out)[N + "mig.strategy"] == "mixed"


class Gfd:
    """`gpu-feature-discovery` as a process, its stderr in a file the test can read while it runs."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("w") as stderr:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", "import sys; from nvidia_device_plugin.cli.gfd import main; "
                 "sys.exit(main())", *argv],
                env={**os.environ, **FILE_OUTPUT, **env},
                stderr=stderr,
            )  # fmt: skip

    def err(self) -> str:
        return self.log.read_text()

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=scaled(30))
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.returncode == 0, self.err()
        return self.err()


def test_gfd_daemon_relabels_and_removes_its_file_on_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    argv = ["-o", str(out), "--sleep-interval", "50ms", "--simulate", "dgx-h100", "--machine-type-file", ""]
    gfd = Gfd(argv, {"GFD_SLEEP_INTERVAL": "1h"}, tmp_path / "err")  # the flag wins over the variable
    try:
        wait_for(
            lambda: read_labels(out).get(N + "gpu.count") == "8", "the first pass", timeout=CHILD_GUARD_S
        )
        first = read_labels(out)[N + "gfd.timestamp"]
        wait_for(
            lambda: read_labels(out).get(N + "gfd.timestamp", first) != first,
            "a second pass",
            timeout=CHILD_GUARD_S,
        )
    finally:
        gfd.stop()
    assert not out.exists()


SHARING = "version: v1\nsharing: {{timeSlicing: {{resources: [{{name: nvidia.com/gpu, replicas: {}}}]}}}}\n"


def test_infinite_sleep_labels_once_sleeps_and_sighup_reloads_the_config(tmp_path: Path) -> None:
    out, config = tmp_path / "gfd", tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    argv = ["-o", str(out), "--sleep-interval", "infinite", "--simulate", "t4-single", "--config-file"]
    gfd = Gfd([*argv, str(config)], {}, tmp_path / "err")
    try:
        wait_for(
            lambda: read_labels(out).get(N + "gpu.replicas") == "1", "the one pass", timeout=CHILD_GUARD_S
        )
        assert gfd.proc.poll() is None  # labelled, and sleeping (it exited 1 here before)
        config.write_text(SHARING.format(4))
        gfd.proc.send_signal(signal.SIGHUP)  # as config-manager's sidecar does after switching the config
        wait_for(
            lambda: read_labels(out).get(N + "gpu.replicas") == "4",
            "the relabel after SIGHUP",
            timeout=CHILD_GUARD_S,
        )
        assert gfd.proc.poll() is None
        # A config that does not load is refused, and the one in use kept (GFD would exit here).
        config.write_text(SHARING.format(0))
        gfd.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: "labelling with the configuration in use" in gfd.err(),
            "the refusal",
            timeout=CHILD_GUARD_S,
        )
        assert gfd.proc.poll() is None and read_labels(out)[N + "gpu.replicas"] == "4"
        config.write_text(SHARING.format(2))
        gfd.proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: read_labels(out).get(N + "gpu.replicas") == "2",
            "the next good config",
            timeout=CHILD_GUARD_S,
        )
    finally:
        err = gfd.stop()
    assert "sleeping until a signal" in err
    assert "replicas" in err.split("labelling with the configuration in use")[0].splitlines()[-1]
    assert not out.exists()
