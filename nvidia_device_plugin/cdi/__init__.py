"""CDI specs for the `cdi-annotations` and `cdi-cri` device-list strategies.

Allocate names devices `k8s.device-plugin.nvidia.com/gpu=<id>`; a container runtime resolves such a name
only through a CDI spec that defines it. This package makes those specs as NVIDIA's plugin makes them:
`scan` looks at the node (the driver root's libraries, graphics files, binaries and firmware; the device
nodes), `spec` and `edits` turn a snapshot's plans and that scan into spec documents (pure functions),
`writer` puts them into the spec directory atomically, removing the ones no longer needed but keeping
every name kubelet may still replay to a running pod's containers (`retention`).
"""
