from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nvidia_device_plugin.daemons.run import Daemon
from nvidia_device_plugin.nvml.sim.node import load_node
from nvidia_device_plugin.plugin.manager import PluginManager
from nvidia_device_plugin.standins.kubelet import KubeletStandIn

from support.daemon_support import GPU, start_daemon
from support.health_support import HEALTH_LOG, Node, make_node
from support.kubelet_standin import kubelet_standin
from support.programs import CHILD_PATH


def pytest_configure(config: pytest.Config) -> None:
    """rfc3987_syntax is left out of this process, and the programs tests start find tests/support/child_path
    first (it hides test-only packages that cost them seconds: see its modules). PYTHONPATH is set where
    only they inherit it: in an xdist worker or a run without workers, never in the xdist controller, whose
    workers import the real packages."""
    # jsonschema imports rfc3987_syntax where it is installed (cyclonedx-bom's extras bring it, for `make
    # release`), which builds an RFC 3987 grammar at import: 1.9 s of CPU in every pytest worker. It only
    # checks the "iri" formats, and no validation here uses a format checker (formats are annotations), so it
    # is left out of the workers (and of the programs tests start: support/child_path/rfc3987_syntax.py);
    # `make release`'s SBOM tool, run outside the tests, still has it.
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
    distributed = getattr(config.option, "numprocesses", None) and config.option.dist != "no"
    if hasattr(config, "workerinput") or not distributed:  # a process that runs tests
        _parse_kubernetes_schemas_once()
        path = os.environ.get("PYTHONPATH", "")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(CHILD_PATH), path) if p)


def _parse_kubernetes_schemas_once() -> None:
    """kubernetes-validate parses a kind's schema file and its definitions (megabytes of JSON) again on every
    call, two thirds of a validation's time; they never change and it only reads them, so each is parsed once
    per process. Imported here, not at the top: it imports jsonschema, after rfc3987_syntax is left out."""
    import kubernetes_validate.utils

    if not hasattr(kubernetes_validate.utils.schema_contents, "cache_clear"):  # not already wrapped
        kubernetes_validate.utils.schema_contents = functools.cache(kubernetes_validate.utils.schema_contents)


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A device-plugin directory for one test. Short, under /tmp: unix socket paths max out near 108 bytes."""
    path = Path(tempfile.mkdtemp(prefix=f"nvdp-{os.getpid()}-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def kubelet(plugin_dir: Path) -> Iterator[KubeletStandIn]:
    """The kubelet side of the protocol, listening on plugin_dir/kubelet.sock."""
    with kubelet_standin(plugin_dir) as k:
        yield k


@pytest.fixture
def daemon(plugin_dir: Path, kubelet: KubeletStandIn) -> Iterator[Daemon]:
    """The daemon on a simulated dgx-a100, registered with the stand-in."""
    d = start_daemon(plugin_dir)
    assert kubelet.wait_for_resources([GPU])
    yield d
    d.stop()


@pytest.fixture
def manager(plugin_dir: Path) -> Iterator[PluginManager]:
    """The generic plugin framework on its own (no GPUs), started in plugin_dir."""
    m = PluginManager(plugin_dir)
    m.start()
    yield m
    m.stop()


# ---- the health monitor on simulated nodes (tests/test_health*.py) --------------------------------------


@pytest.fixture
def dgx() -> Iterator[Node]:
    """A HealthMonitor-ready simulated dgx-a100 (see health_support.make_node)."""
    yield from make_node(load_node("dgx-a100"))


@pytest.fixture
def health_log(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """caplog, capturing the health monitor's DEBUG lines."""
    caplog.set_level(logging.DEBUG, logger=HEALTH_LOG)
    return caplog
