"""Node labels: NVIDIA GPU Feature Discovery's label set (and ours) from the snapshot the plugin serves.

gfd and gfd_resources (GFD's rules), topology (our `nvdp.nvidia.com/` additions), node (the pure function
that combines them), nfd (NFD's features.d file format), nodefeature (NFD's NodeFeature object, through
the kubernetes client), writer (the daemon's file thread). The writer is imported from
labels.writer and not re-exported here: every command builds its parser from labels.nfd, and must not
load the whole pipeline for that. The commands (`labels`, `--labels-file`, `gpu-feature-discovery`) are
in cli/.
"""

from nvidia_device_plugin.labels.node import LabelSettings, node_labels

__all__ = ["LabelSettings", "node_labels"]
