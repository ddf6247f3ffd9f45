"""Node labels: NVIDIA GPU Feature Discovery's label set (and ours) from the snapshot the plugin serves.

gfd (GFD's rules), topology (our `nvdp.nvidia.com/` additions), node (the pure function that combines them),
nfd (NFD's features.d file format), writer (the daemon's file thread). The commands (`labels`,
`--labels-file`, `gpu-feature-discovery`) are in cli/.
"""

from nvidia_device_plugin.labels.node import LabelSettings, node_labels
from nvidia_device_plugin.labels.writer import LabelsFileWriter, LabelsOptions

__all__ = ["LabelSettings", "LabelsFileWriter", "LabelsOptions", "node_labels"]
