"""Where the DRA mode finds things on the node: `run` always builds these (its flags), DRA on or off.

Kept apart from dra/mode.py so that building them, with the config's `dra.enabled` off, loads none of the
DRA mode's modules (ResourceSlices, pod-resources, the kubelet plugin).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvidia_device_plugin.dra.publisher import SliceApi

POLL_INTERVAL_S = 1.0  # pod-resources readings while a GPU moves
# How long a kubelet that just (re)started, or answered again after a failed reading, must have served
# pod-resources before the handover believes it: kubelet restores its pods (from the API server and its
# static pod files) after its socket is up, and until then answers that no pod holds anything.
KUBELET_RESTART_GRACE_S = 30.0


@dataclass(frozen=True)
class DraOptions:
    """Where the DRA mode finds things on the node (cli/dra.py's flags); the config turns it on."""

    node_name: str
    pod_resources_socket: Path
    kubelet_plugins_dir: Path
    kubelet_registry_dir: Path
    api_client: Callable[[], Any]  # a `kubernetes` ApiClient (in-cluster, or $KUBECONFIG)
    slice_api: Callable[[Any], SliceApi] | None = None  # None: dra.apiserver.KubeSliceApi
    poll_interval_s: float = POLL_INTERVAL_S
    kubelet_restart_grace_s: float = KUBELET_RESTART_GRACE_S
