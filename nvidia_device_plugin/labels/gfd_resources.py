"""GFD's per-resource labels: `nvidia.com/gpu.*` for whole GPUs, `nvidia.com/mig-<profile>.*` (mixed) or
`nvidia.com/gpu.*` (single) for MIG devices. The rules, and where they are odd, are in labels/gfd.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nvidia_device_plugin.config.v1 import ReplicatedResource, Sharing
from nvidia_device_plugin.devices import Gpu, MigDevice

PREFIX = "nvidia.com/"
GPU_RESOURCE = PREFIX + "gpu"
_MIB = 1024 * 1024
_INVALID_PRODUCT_CHARS = re.compile(r"[^A-Za-z0-9\-_. ]")


def sanitise(text: str) -> str:
    """A name as GFD writes it in a label value: characters outside `A-Za-z0-9-_. ` dropped, each run of
    blanks one `-` ("Standard PC (Q35 + ICH9, 2009)" -> "Standard-PC-Q35-ICH9-2009")."""
    return "-".join(_INVALID_PRODUCT_CHARS.sub("", text).split())


def arch_family(major: int, minor: int) -> str:
    """GFD's architecture name of a CUDA compute capability ("undefined" for majors it does not know)."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    families.update({10: "blackwell", 12: "blackwell", 13: "rubin"})
    return families.get(major, "undefined")


def mig_name(profile: str) -> str:
    """A MIG profile as GFD names it in keys and products: "+" written as "." ("1g.18gb+me" ->
    "1g.18gb.me"), as in the resource name nvidia.com/mig-1g.18gb.me."""
    return profile.replace("+", ".")


@dataclass(frozen=True)
class _Resource:
    """One resource as GFD labels it: `<name>.<suffix>` keys; sharing None means "sharing disabled"."""

    name: str
    sharing: Sharing | None

    def key(self, suffix: str) -> str:
        return f"{self.name}.{suffix}"

    def _entry(self) -> ReplicatedResource | None:
        if self.sharing is None:
            return None
        return next((r for r in self.sharing.active.resources if r.name == self.name), None)

    def replicas(self) -> int:
        if self.sharing is None:
            return 0
        entry = self._entry()
        return entry.replicas if entry is not None else 1

    def product(self, parts: Iterable[str]) -> str:
        names = [sanitise(p) for p in parts if p]
        entry = self._entry()
        if names and entry is not None and entry.replicas > 1 and entry.rename is None:
            names.append("SHARED")
        return "-".join(names)

    def base(self, count: int, parts: Sequence[str]) -> dict[str, str]:
        replicas = self.replicas()
        strategy = self.sharing.strategy if self.sharing is not None and replicas > 1 else "none"
        return {
            self.key("product"): self.product(parts),
            self.key("count"): str(count),
            self.key("replicas"): str(replicas),
            self.key("sharing-strategy"): strategy,
        }


def full_gpu_labels(gpus: Sequence[Gpu], sharing: Sharing) -> dict[str, str]:
    """`nvidia.com/gpu.*` of the node's GPU model; with several models, of the one discovered last."""
    named = [g for g in gpus if g.name]
    counts: dict[str, int] = {}
    for gpu in named:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    labels: dict[str, str] = {}
    # Later models override earlier ones key by key, as GFD's merge does: MIG-mode GPUs first, then whole
    # GPUs; within each, models in the order of their last GPU, so the model discovered last wins.
    for mig_mode in (True, False):
        group = [g for g in named if g.mig_enabled == mig_mode]
        for gpu in _model_representatives(group):
            resource = _Resource(GPU_RESOURCE, None if mig_mode else sharing)
            labels.update(_gpu_labels(resource, gpu, counts[gpu.name]))
    return labels


def _model_representatives(gpus: Sequence[Gpu]) -> list[Gpu]:
    """One GPU per model, models ordered by their last GPU: the model's last GPU that could be read (GFD
    labels from the GPUs it can read), else its last GPU."""
    last: dict[str, Gpu] = {}
    readable: dict[str, Gpu] = {}
    for gpu in gpus:
        last.pop(gpu.name, None)  # re-inserted: dict order becomes "order of last GPU"
        last[gpu.name] = gpu
        if not gpu.lost:
            readable[gpu.name] = gpu
    return [readable.get(name, gpu) for name, gpu in last.items()]


def _gpu_labels(resource: _Resource, gpu: Gpu, count: int) -> dict[str, str]:
    labels = resource.base(count, [gpu.name])
    memory_mib = gpu.memory_bytes // _MIB
    if memory_mib:
        labels[resource.key("memory")] = str(memory_mib)
    if gpu.compute_capability is not None and gpu.compute_capability[0] != 0:
        major, minor = gpu.compute_capability
        labels[resource.key("family")] = arch_family(major, minor)
        labels[resource.key("compute.major")] = str(major)
        labels[resource.key("compute.minor")] = str(minor)
    return labels


def _mig_labels(resource: _Resource, mig: MigDevice, parent: Gpu, count: int) -> dict[str, str]:
    labels = resource.base(count, [parent.name, "MIG", mig_name(mig.profile)])
    a = mig.attributes
    if a is not None:
        values = {
            "memory": a.memory_mb,
            "multiprocessors": a.multiprocessors,
            "slices.gi": a.gpu_instance_slices,
            "slices.ci": a.compute_instance_slices,
            "engines.copy": a.copy_engines,
            "engines.decoder": a.decoders,
            "engines.encoder": a.encoders,
            "engines.jpeg": a.jpeg_decoders,
            "engines.ofa": a.ofa_engines,
        }
        labels.update({resource.key(k): str(v) for k, v in values.items()})
    return labels


def _profiles(gpus: Sequence[Gpu]) -> dict[str, tuple[MigDevice, Gpu, int]]:
    """Per MIG profile (GFD's name), in discovery order: its first device, that device's GPU, the count."""
    found: dict[str, tuple[MigDevice, Gpu, int]] = {}
    for gpu in gpus:
        for mig in gpu.mig_devices:
            name = mig_name(mig.profile)
            first, parent, count = found.get(name, (mig, gpu, 0))
            found[name] = (first, parent, count + 1)
    return found


def single_labels(gpus: Sequence[Gpu], sharing: Sharing) -> dict[str, str]:
    """The single strategy's MIG labels (over the whole-GPU ones); `-MIG-INVALID` when the node breaks it."""
    mig_gpus = [g for g in gpus if g.mig_enabled]
    if not mig_gpus:
        return {}  # as the none strategy
    profiles = _profiles(gpus)
    broken = any(not g.mig_devices for g in mig_gpus) or len(mig_gpus) != len(gpus) or len(profiles) != 1
    if broken:
        invalid = _Resource(GPU_RESOURCE, None)
        return {
            invalid.key("product"): invalid.product([mig_gpus[0].name, "MIG", "INVALID"]),
            invalid.key("count"): "0",
            invalid.key("replicas"): "0",
            invalid.key("memory"): "0",
            invalid.key("sharing-strategy"): "",  # GFD v0.20 writes it empty here
        }
    [(mig, parent, count)] = profiles.values()
    return _mig_labels(_Resource(GPU_RESOURCE, sharing), mig, parent, count)


def mixed_labels(gpus: Sequence[Gpu], sharing: Sharing) -> dict[str, str]:
    """The mixed strategy's `nvidia.com/mig-<profile>.*` labels, one set per profile."""
    labels: dict[str, str] = {}
    for name, (mig, parent, count) in _profiles(gpus).items():
        labels.update(_mig_labels(_Resource(f"{PREFIX}mig-{name}", sharing), mig, parent, count))
    return labels
