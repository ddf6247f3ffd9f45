"""Which GPUs break the MIG strategy's rules, so the rest of the node is still served.

NVIDIA's plugin warns and serves the other GPUs when `migStrategy: mixed` meets a GPU in MIG mode without
MIG devices (normal halfway through a MIG reconfiguration), and exits for `single` layouts it cannot
serve. Here both serve every resource that is valid and name each GPU that breaks a rule; the daemon logs
one line per violation and counts it (`nvidia_device_plugin_mig_strategy_violations`).

`single`: MIG mode on for all GPUs or for none, and one profile on the node. When it is broken, the GPUs in
MIG mode with the node's most common profile (by device count; ties: the profile of the lowest GPU index)
are served, and the others are left out: GPUs in MIG mode with another profile, GPUs not in MIG mode, GPUs
in MIG mode without MIG devices.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from nvidia_device_plugin.config.v1 import MigStrategy, advertises_mig_devices
from nvidia_device_plugin.devices import Gpu


@dataclass(frozen=True)
class MigLayoutViolation:
    """One GPU left out of the advertised resources because it breaks the MIG strategy."""

    gpu_index: int
    gpu_uuid: str
    strategy: str
    message: str


def mig_layout_violations(gpus: Sequence[Gpu], strategy: MigStrategy) -> tuple[MigLayoutViolation, ...]:
    """The GPUs of `gpus` (in any order) that break `strategy`, by GPU index; () under `none`.

    The pipeline (snapshot.build_snapshot) asks once per snapshot and hands the answer to build_resources,
    which leaves these GPUs out, and to the daemon, which logs and counts them.
    """
    if not advertises_mig_devices(strategy):
        return ()
    gpus = sorted(gpus, key=lambda gpu: gpu.index)
    found: list[MigLayoutViolation] = []

    def violate(gpu: Gpu, why: str) -> None:
        found.append(
            MigLayoutViolation(
                gpu.index,
                gpu.uuid,
                strategy,
                f"flags.migStrategy={strategy}: {gpu.label} {why}; it is not advertised",
            )
        )

    enabled = [gpu for gpu in gpus if gpu.mig_enabled]
    for gpu in enabled:
        if not gpu.mig_devices:
            violate(
                gpu,
                "is in MIG mode but has no MIG devices (normal during a MIG reconfiguration; create them, "
                "for example with nvidia-mig-parted, or disable MIG mode)",
            )
    if strategy != "single" or not enabled:
        return tuple(found)
    for gpu in gpus:
        if not gpu.mig_enabled and not gpu.lost:
            violate(
                gpu,
                "is not in MIG mode while other GPUs are (single needs MIG on all GPUs or none; "
                "migStrategy=mixed advertises both)",
            )
    counts: Counter[str] = Counter(mig.profile for gpu in enabled for mig in gpu.mig_devices)
    if len(counts) > 1:
        first_seen = {mig.profile: gpu.index for gpu in reversed(enabled) for mig in gpu.mig_devices}
        chosen = max(counts, key=lambda profile: (counts[profile], -first_seen[profile]))
        for gpu in enabled:
            profiles = sorted({mig.profile for mig in gpu.mig_devices})
            if gpu.mig_devices and profiles != [chosen]:
                violate(
                    gpu,
                    f"has MIG profiles {', '.join(profiles)} where the node serves {chosen} (single needs "
                    "one profile on the node; migStrategy=mixed advertises one resource per profile)",
                )
    return tuple(found)
