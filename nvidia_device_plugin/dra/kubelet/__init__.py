"""The kubelet side of DRA: the plugin kubelet calls to prepare and unprepare ResourceClaims on this node.

`plugin.DraKubeletPlugin` is the one object a daemon starts. It serves kubelet's plugin registration
(`registration`) on `<driver>-reg.sock` in the plugins_registry directory and the DRAPlugin service in both
advertised versions (`wire`) on `<plugins dir>/<driver>/dra.sock` (`sockets`). A prepare fetches each claim
from the API (`claims`), checks it against the node's devices and writes one CDI spec per claim
(`cdispec`), remembering what it did in a checkpoint (`checkpoint`) so that a repeated call, a restart of
the daemon and an unprepare all find the same state (`prepare`). The values passed between them are in
`model`.
"""
