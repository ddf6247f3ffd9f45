"""DRA (resource.k8s.io/v1) from the same daemon: ResourceSlices and DeviceClasses from the snapshot, and
the kubelet DRA plugin that prepares claims. Off by default."""
