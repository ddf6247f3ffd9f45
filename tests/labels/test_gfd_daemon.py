"""daemons/gfd.py: GFD's labelling is a worker of its daemon, replaced on reload and joined on stop.

In-process, on a simulated node, writing a features.d file under tmp_path; no signal is sent (the signal
handling of `gpu-feature-discovery` is test_gfd_command.py's, on a process of its own).
"""

from __future__ import annotations

import threading
from functools import partial
from pathlib import Path

from nvidia_device_plugin.cli.gfd_settings import GfdSettings
from nvidia_device_plugin.cli.session import open_session
from nvidia_device_plugin.config.v1 import Config
from nvidia_device_plugin.daemons.gfd import GfdConfig, GfdDaemon, GfdOptions, NodeFeatureTargetOptions

from support.labels_file import read_labels
from support.waiting import wait_for

N = "nvidia.com/"


def test_the_labeller_is_a_worker_of_the_daemon_replaced_on_reload_and_joined_on_stop(tmp_path: Path) -> None:
    out = tmp_path / "gfd"
    settings = GfdSettings(
        oneshot=False,
        no_timestamp=True,
        sleep_interval=None,  # infinite: one pass per configuration
        output_file=str(out),
        machine_type_file="",
        use_node_feature_api=False,
    )
    loads: list[int] = []

    def load() -> GfdConfig:
        loads.append(1)
        return GfdConfig(Config(), settings)

    no_api = NodeFeatureTargetOptions(node_name=None, namespace=None, pod_name=None, kubeconfig=None)
    daemon = GfdDaemon(GfdOptions(load, partial(open_session, "t4-single"), no_api))
    before = set(threading.enumerate())
    daemon.start()
    try:
        wait_for(lambda: N + "gpu.count" in read_labels(out), "the first pass")
        (first,) = list(daemon.workers)
        assert first.name == "gfd-labels" and first.alive
        out.unlink()
        daemon.reload()
        wait_for(lambda: N + "gpu.count" in read_labels(out), "the pass after the reload")
        (second,) = list(daemon.workers)
        assert second is not first and second.alive and not first.alive
        assert len(loads) == 2  # the configuration read afresh
    finally:
        daemon.stop()
    assert not second.alive
    assert "gfd-labels" not in {t.name for t in threading.enumerate() if t not in before}
    assert out.exists()  # the output stays until the exit removes it
    daemon.remove_output()
    assert not out.exists()
