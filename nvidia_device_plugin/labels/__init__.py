"""Node labels: NVIDIA GPU Feature Discovery's label set (and ours) from the snapshot the plugin serves.

gfd and gfd_resources (GFD's rules), topology (our `nvdp.nvidia.com/` additions), node (the pure function
that combines them), nfd (NFD's features.d file format), nodefeature (NFD's NodeFeature object, through
the kubernetes client), writer (the daemon's file thread). The writer is imported from
labels.writer and not re-exported here: every command builds its parser from labels.nfd, and must not
load the whole pipeline for that. The commands (`labels`, `--labels-file`, `gpu-feature-discovery`) are
in cli/.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nvidia_device_plugin.labels.node import LabelSettings, node_labels

__all__ = ["LabelSettings", "node_labels"]


def __getattr__(name: str) -> Any:
    """The re-exports, loaded on first use: importing labels.nfd (as every command's parser does) must not
    load the label pipeline (labels.node and GFD's tables), which costs `run` start-up time and memory."""
    if name in __all__:
        from nvidia_device_plugin.labels import node

        return getattr(node, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
