"""CDI specs for the `cdi-annotations` and `cdi-cri` device-list strategies.

Allocate names devices `k8s.device-plugin.nvidia.com/gpu=<id>`; a container runtime resolves such a name
only through a CDI spec that defines it. This package makes those specs: `scan` looks at the node (the
driver root's libraries, binaries and firmware; the device nodes), `spec` turns a snapshot's plans and that
scan into spec documents (a pure function), `writer` puts them into the spec directory atomically and
removes the ones no longer needed.
"""
