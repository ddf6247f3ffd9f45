"""The `imex` section at start and on reload: whether its required channels exist, and what is done with it.

Allocate gives the channels to containers (serving/allocate.py, `_update_for_imex` and the CDI names);
this decides whether a snapshot can be served at all (`imex.required`) and says once what happens.
"""

from __future__ import annotations

from nvidia_device_plugin import devnodes
from nvidia_device_plugin.config.v1 import any_cdi_enabled
from nvidia_device_plugin.serving.allocate import AllocationSettings


def imex_problem(settings: AllocationSettings) -> str | None:
    """Why the config's required IMEX channels cannot be given to containers; None when they can."""
    if not settings.imex_required:
        return None
    present = set(devnodes.present_imex_channels(settings.imex_channel_ids, settings.device_node_probe_root))
    missing = [p for p in map(devnodes.imex_channel_path, settings.imex_channel_ids) if p not in present]
    if not missing:
        return None
    return (
        f"imex.required is true but IMEX channel {', '.join(missing)} does not exist on this node (under "
        f"{settings.device_node_probe_root}); create the channel (nvidia-modprobe -i, or the IMEX daemon "
        "setup) or set imex.required to false"
    )


def imex_summary(settings: AllocationSettings) -> str:
    """One start-up line on what is done with the `imex` section."""
    if not settings.imex_channel_ids:
        return "imex: no IMEX channels configured"
    present = devnodes.present_imex_channels(settings.imex_channel_ids, settings.device_node_probe_root)
    paths = [devnodes.imex_channel_path(c) for c in settings.imex_channel_ids]
    state = "present" if len(present) == len(paths) else "missing, not injected until it appears"
    if any_cdi_enabled(settings.device_list_strategy) and len(present) != len(
        paths
    ):  # the CDI spec of the snapshot must define it
        state = "missing, not injected until it appears and the config is reloaded"
    required = "required" if settings.imex_required else "not required"
    return f"imex: injecting {', '.join(paths)} into every container ({state}; {required})"
