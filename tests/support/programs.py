"""The environment of the programs tests start (config-manager, gpu-feature-discovery, the daemon).

CHILD_PATH goes first on their PYTHONPATH: it hides test-only packages the image does not have and that cost
a program seconds to import (child_path/kubernetes_validate.py says which and why). tests/conftest.py puts
it on this process's PYTHONPATH for programs started with the test's environment; `clean_environment` gives
it to programs started with an environment of their own, as a container would have.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from support.waiting import scaled

if TYPE_CHECKING:
    from nvidia_device_plugin.standins.kubelet import KubeletStandIn

CHILD_PATH = Path(__file__).parent / "child_path"


def clean_environment(**variables: str) -> dict[str, str]:
    """PATH (this process's), CHILD_PATH as PYTHONPATH, then `variables`; nothing else of the test's."""
    return {"PATH": os.environ["PATH"], "PYTHONPATH": str(CHILD_PATH), **variables}


def config_manager_environment(
    tmp_path: Path, api_url: str, names: list[str], **extra: str
) -> dict[str, str]:
    """config-manager's clean environment against the API at `api_url`, on node NODE: one config per name
    in tmp_path/available-configs (made here), linked at tmp_path/config.yaml; `extra` last."""
    # Here, not at the top: tests/conftest.py imports this module before its pytest_configure leaves
    # rfc3987_syntax out, and the fake API server imports jsonschema, which would build that grammar then.
    from support.fake_apiserver import NODE, write_kubeconfig

    srcdir = tmp_path / "available-configs"
    srcdir.mkdir(exist_ok=True)
    for name in names:
        (srcdir / name).write_text(f"# {name}\nversion: v1\n")
    return clean_environment(
        KUBECONFIG=str(write_kubeconfig(tmp_path / "kubeconfig", api_url)),
        NODE_NAME=NODE,
        CONFIG_FILE_SRCDIR=str(srcdir),
        CONFIG_FILE_DST=str(tmp_path / "config.yaml"),
        **extra,
    )


def output_of_a_served_run(
    script: str, argv: Sequence[str], kubelet: KubeletStandIn, resources: Sequence[str]
) -> str:
    """What `python -c script *argv` printed, a program that runs the daemon (`run ...` through the real
    entry point), once kubelet listed `resources` and the program stopped on SIGTERM with status 0."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert kubelet.wait_for_resources(list(resources), timeout=scaled(30))
        proc.send_signal(signal.SIGTERM)
        output, errors = proc.communicate(timeout=scaled(30))
    finally:
        proc.kill()
    assert proc.returncode == 0, errors
    return output
