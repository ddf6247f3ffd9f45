"""What the docs claim about configs, read from the docs and checked against the behaviour.

Each test quotes its statement from the page (so an edit to either side fails it): configuration.md on
unknown fields, resource naming, MPS requests and the flags; troubleshooting.md on MIG strategy messages;
migration.md on the field names it cites; metrics.md on the metrics (every one exported is documented in a
table, and no row strays outside one); performance.md on the files it names.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from nvidia_device_plugin.cli.main import main
from nvidia_device_plugin.config import naming
from nvidia_device_plugin.config.loader import parse_config, parse_config_text
from nvidia_device_plugin.config.options import CONFIG_OPTIONS
from nvidia_device_plugin.config.schema import PATTERN_FIELDS, REPLICATED_RESOURCE_FIELDS, RESOURCES_FIELDS
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.mig_layout import mig_layout_violations
from nvidia_device_plugin.sharing.readiness import GpuMpsStatus, status_path, write_status
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.checks import assert_all
from support.daemon_support import GPU, start_daemon

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def page(name: str) -> str:
    """A doc page with its lines joined, so a sentence wrapped over lines reads as written."""
    return " ".join((DOCS / name).read_text().split())


def section(name: str, heading: str) -> str:
    text = (DOCS / name).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return " ".join(text[start : end if end > 0 else None].split())


def quoted(text: str) -> list[str]:
    return re.findall(r"`([^`\s]+(?: [^`\s]+)*)`", text)


# ---- configuration.md and troubleshooting.md: unknown fields -----------------------------------------------


def test_unknown_fields_are_refused_by_check_config_and_served_with_a_warning_by_the_daemon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = page("configuration.md")
    claim = "flags.plugin.passDeviceSpec: unknown field (did you mean passDeviceSpecs?)"
    assert (
        "**Unknown fields.** A misspelt field is reported with its path and the closest known name "
        f"(`{claim}`)" in text
    )
    assert "`check-config` refuses it (exit 1). The daemon (`run`), like NVIDIA's, serves the config" in text
    path = tmp_path / "c.yaml"
    path.write_text("flags: {plugin: {passDeviceSpec: true}}\n")
    assert main(["check-config", str(path)], {}) == 1
    assert capsys.readouterr().err == f"{path}: {claim}\n"
    served = parse_config({"flags": {"plugin": {"passDeviceSpec": True}}}, str(path), strict=False)
    assert [w.message for w in served.warnings] == [f"{path}: {claim}; ignored"]
    assert "Unknown fields are errors" not in page("troubleshooting.md")
    assert "Unknown fields alone do not make a config bad for the daemon" in page("troubleshooting.md")


def test_the_typo_example_is_what_every_command_reports(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    text = page("configuration.md")
    hint, missing = (
        "sharing.timeSlicing.resources[0].replica: unknown field (did you mean replicas?)",
        "sharing.timeSlicing.resources[0].replicas: required field is missing",
    )
    assert f"`replica: 4` gives `{hint}` next to the `{missing}` it causes" in text
    for strict in (True, False):  # check-config, and plan / run
        with pytest.raises(Exception) as err:
            parse_config(
                {"sharing": {"timeSlicing": {"resources": [{"name": "gpu", "replica": 4}]}}},
                "c",
                strict=strict,
            )
        assert str(err.value) == f"c: {hint}; {missing}"


# ---- configuration.md: resource naming ---------------------------------------------------------------------


def test_resource_naming_is_ignored_with_nvidias_words_unless_asked_for() -> None:
    text = page("configuration.md")
    for sentence in (
        naming.RESOURCES_IGNORED,
        naming.RENAME_IGNORED.format(section="timeSlicing"),
        naming.DEVICES_IGNORED.format(section="timeSlicing"),
    ):
        assert f"`{sentence}`" in text
    assert "`resourceNaming` | `--resource-naming` / `NVDP_RESOURCE_NAMING` | `false` |" in text
    v020 = "resources: {gpus: [{pattern: '*A100*', name: a100}]}\n"
    assert parse_config_text(v020).resources.gpus == ()
    assert parse_config_text("flags: {resourceNaming: true}\n" + v020).resources.gpus != ()


def test_every_flag_of_a_config_field_is_in_the_reference() -> None:
    text = page("configuration.md")
    for option in CONFIG_OPTIONS:
        assert f"`{option.flags[0]}`" in text, option.flags[0]
        assert f"`{option.env[0]}`" in text, option.env[0]


# ---- configuration.md: MPS requests ------------------------------------------------------------------------


@pytest.fixture
def mps_daemon(tmp_path: Path, plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[Daemon]:
    mps_root = tmp_path / "mps"
    text = (
        f"flags: {{mpsRoot: {mps_root}}}\nsharing: {{mps: {{failRequestsGreaterThanOne: false, "
        "resources: [{name: gpu, replicas: 4}]}}\n"
    )
    config = parse_config_text(text)
    daemon = start_daemon(plugin_dir, load_config=lambda: config, mps_poll_interval_s=0.05)
    assert daemon.snapshot is not None
    for gpu in daemon.snapshot.inventory.gpus:  # what a running mps-control-daemon publishes
        path = status_path(str(mps_root), GPU, gpu.uuid)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        write_status(path, GpuMpsStatus(ready=True, reason="running", pid=1))
    assert kubelet.wait_for_resources([GPU])  # all() of no devices yet would pass at once
    assert kubelet.wait_for(lambda: all(d.health == "Healthy" for d in kubelet.devices(GPU).values()))
    yield daemon
    daemon.stop()


def test_mps_honours_false_on_one_gpu_and_refuses_requests_spanning_gpus(
    mps_daemon: Daemon, kubelet: KubeletStandIn
) -> None:
    claim = (
        "For MPS, `false` is honoured: n replicas of one GPU in a container give it n shares of that GPU's "
        "memory and threads; a container's MPS replicas must be on one GPU, and a request spanning GPUs is "
        "refused (INVALID_ARGUMENT), where NVIDIA allocates it."
    )
    assert claim in page("configuration.md")
    assert "MPS always refuses more than one" not in page("configuration.md")
    ids = sorted(kubelet.devices(GPU))
    first_gpu = [i for i in ids if i.startswith(ids[0].split("::")[0])]
    two_shares = kubelet.allocate(GPU, [first_gpu[:2]]).container_responses[0]
    assert two_shares.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"  # 2 x 100/4
    other_gpu = next(i for i in ids if not i.startswith(ids[0].split("::")[0]))
    with pytest.raises(grpc.RpcError) as err:
        kubelet.allocate(GPU, [[first_gpu[2], other_gpu]])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "MPS replicas of one container must be on one GPU" in err.value.details()  # type: ignore[attr-defined]


# ---- troubleshooting.md: MIG strategy ----------------------------------------------------------------------


def _violations(node_file: Path | str, strategy: str) -> list[str]:
    session = open_nvml(str(node_file))
    try:
        gpus = discover(session.nv, session.host.sysfs_root, session.host.proc_root).gpus
    finally:
        session.close()
    return [v.message for v in mig_layout_violations(gpus, strategy)]


def test_mig_strategy_messages_are_the_ones_the_plugin_logs_and_it_leaves_gpus_out(tmp_path: Path) -> None:
    text = section("troubleshooting.md", "MIG strategy errors")
    assert "A MIG layout that does not fit `flags.migStrategy` does not stop the plugin" in text
    assert "refuses to start (or to apply a reloaded config) when the MIG layout" not in text
    no_devices = tmp_path / "node.yaml"
    no_devices.write_text(
        "gpus:\n"
        + "".join("  - {name: NVIDIA A100-SXM4-80GB, memory_mib: 81920, mig: [1g.10gb]}\n" for _ in range(7))
        + "  - {name: NVIDIA A100-SXM4-80GB, memory_mib: 81920, mig: []}\n"
    )
    logged = _violations("h100-nvl", "single") + _violations(no_devices, "mixed")
    claims = [q for q in quoted(text) if q.startswith("flags.migStrategy=") and "(...)" in q]
    assert len(claims) == 3
    for claim in claims:
        pattern = ".*".join(re.escape(part) for part in claim.split("(...)"))
        assert any(re.fullmatch(pattern, line) for line in logged), (claim, logged)


# ---- migration.md: the fields it names ---------------------------------------------------------------------


def test_migration_names_only_fields_the_format_has() -> None:
    text = page("migration.md")
    assert "resources.migs" not in text
    for field in re.findall(r"`resources\.(\w+)\[\]\.(\w+)`", text):
        assert field[0] in RESOURCES_FIELDS and field[1] in PATTERN_FIELDS, field
    for key in re.findall(r"sharing `(\w+)`/`(\w+)`", text):
        assert set(key) <= set(REPLICATED_RESOURCE_FIELDS), key
    assert "One `nvidia-cuda-mps-control` per shared GPU inside this pod" not in text
    assert "`mpsRoot`: `/run/nvidia/mps` here" in text and Config().flags.mps_root == "/run/nvidia/mps"


# ---- metrics.md: every metric in a table, every exported metric documented ---------------------------------


def test_every_metric_is_documented_in_a_table_row(daemon: Daemon) -> None:
    lines = (DOCS / "metrics.md").read_text().splitlines()
    rows: list[str] = []
    in_table = False
    for line in lines:
        if line.startswith("| Metric |"):
            in_table = True
        elif not line.startswith("|"):
            in_table = False
        elif in_table and line.startswith("| `nvidia_device_plugin_"):
            rows.append(line)
        assert not (line.startswith("| `nvidia_device_plugin_") and not in_table), f"stray row: {line}"
    documented = {re.match(r"\| `(nvidia_device_plugin_\w+)`", row).group(1) for row in rows}  # type: ignore[union-attr]
    assert_all(rows, lambda row: row.count(" | ") == 3)  # metric, type, labels, meaning
    body, _ = daemon.metrics.render("text/plain")
    exported = set()
    for match in re.finditer(r"^# TYPE (\S+) (\S+)$", body.decode(), re.MULTILINE):
        name, kind = match.groups()
        if not name.endswith("_created"):  # prometheus_client's creation time of a counter or histogram
            exported.add(name if kind != "counter" or name.endswith("_total") else name + "_total")
    assert exported == documented


# ---- performance.md: the files it names --------------------------------------------------------------------


def test_every_file_performance_md_names_exists() -> None:
    names = [q for q in quoted(page("performance.md")) if re.fullmatch(r"[\w./-]+\.(yaml|py|json|txt)", q)]
    names = [n for n in names if not n.startswith("bench/results.")]  # what `make bench` writes
    assert "bench/configs/mig-1g-time-slicing-100.yaml" in names
    for name in names:
        assert "/" in name, f"{name}: name the file with its folder"
        assert (ROOT / name).exists() or (ROOT / "nvidia_device_plugin" / name).exists(), name


def test_a_sharing_entry_matching_nothing_is_skipped_with_a_warning() -> None:
    from nvidia_device_plugin.daemons.announce import notices
    from nvidia_device_plugin.snapshot import build_snapshot

    assert (
        "An entry for a resource this node does not have is skipped, so one ConfigMap can serve different "
        "nodes; the daemon (and `plan`) says so in a warning naming the resources the node has"
    ) in page("configuration.md")
    config = parse_config_text("sharing: {timeSlicing: {resources: [{name: a100, replicas: 2}]}}")
    session = open_nvml("t4-single")
    try:
        snapshot = build_snapshot(session, config)
    finally:
        session.close()
    assert [p.name for p in snapshot.plans] == [GPU]  # skipped: the T4 stays whole
    assert [n.message for n in notices(snapshot)] == [
        "config: sharing.timeSlicing.resources[0] shares nvidia.com/a100, which no device of this node is "
        "advertised as (this node has nvidia.com/gpu); the entry is skipped"
    ]
