"""The kubelet stand-in as the suite builds it: its default waits and calls to a plugin budgeted by the
suite's one wait factor (support.waiting), so a loaded machine gets more time, never another assertion."""

from __future__ import annotations

import functools

from nvidia_device_plugin.standins.kubelet import CALL_S, WAIT_S, KubeletStandIn

from support.waiting import scaled

# KubeletStandIn(plugin_dir, ...), its `wait_for*` and `allocate`/`preferred` budgets scaled.
kubelet_standin = functools.partial(KubeletStandIn, wait_s=scaled(WAIT_S), call_s=scaled(CALL_S))
