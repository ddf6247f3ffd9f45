"""NVIDIA GPU Feature Discovery's label set, computed from the inventory and config the plugin serves.

The rules are GFD's (k8s-device-plugin v0.15+, `internal/lm`); docs/labels.md lists every label. Where
GFD is odd, the oddity is kept, because selectors in clusters are written against what GFD publishes:

- `nvidia.com/gpu.count` counts every physical GPU of the labelled model, MIG-enabled ones included, even
  under the mixed strategy (a node with 3 MIG-enabled A100s and 1 whole A100 says `gpu.count=4`).
- GPUs in MIG mode get whole-GPU labels without sharing: `gpu.replicas=0`, `sharing-strategy=none`;
  a whole GPU of the same model overrides them with the sharing config's values.
- `gpu.product` gets `-SHARED` only when the resource is shared (replicas > 1) AND not renamed
  (`rename` or `renameByDefault` drop the suffix: the renamed resource already says it is shared).
  `replicas: 1` is "not shared" (GFD refuses such a file; we accept it and label it as unshared).
- Product names are sanitised GFD's way: characters other than `A-Za-z0-9-_. ` are dropped, runs of
  blanks become one `-`. So a `1g.18gb+me` MIG profile is `...-MIG-1g.18gbme` in `product`, while the
  per-profile keys keep the `+` (`nvidia.com/mig-1g.18gb+me.count`): Kubernetes refuses such keys and
  NFD drops them, as it does GFD's.
- `mig.strategy` is only published for single and mixed. Under single, a node that breaks the strategy
  (a MIG-enabled GPU without MIG devices, MIG and non-MIG GPUs, several profiles) gets
  `gpu.product=<model>-MIG-INVALID` with `count`, `replicas` and `memory` 0.
- `gpu.mode` is decided by the first GPU's PCI class (GFD stops looking at the first GPU that differs).
- `gpu.family` is `undefined` for compute capabilities GFD does not know (4.x, 11.x).

Where GFD would fail the whole run (and publish nothing), the label that cannot be computed is left out
and the rest published: an unreadable compute capability drops family/compute labels, an unknown
driver or CUDA version drops the version labels, a missing PCI class drops `gpu.mode`, and MPS sharing on
a node with MIG-enabled GPUs gives `mps.capable=false`. When several GPU models are on one node GFD picks
the labelled model by Go map order (random); here the model of the lowest-indexed whole GPU wins (MIG-mode
GPUs only when no whole GPU exists). GPUs whose name could not be read are not labelled by model.
Not published: vGPU (`nvidia.com/vgpu.*`) and fabric/IMEX (`nvidia.com/gpu.clique`) labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from nvidia_device_plugin.config.v1 import Config, ReplicatedResource, Sharing
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice

GPU_RESOURCE = "nvidia.com/gpu"
PREFIX = "nvidia.com/"
_MIB = 1024 * 1024
_INVALID_PRODUCT_CHARS = re.compile(r"[^A-Za-z0-9\-_. ]")
_PCI_CLASS_MODES = {"0x030000": "graphics", "0x030200": "compute"}


def gfd_labels(inventory: Inventory, config: Config, machine_type: str = "unknown") -> dict[str, str]:
    """GFD's labels for this node (without `gfd.timestamp`); empty when there are no GPUs."""
    gpus = inventory.gpus
    if not gpus:
        return {}
    labels = {PREFIX + "gpu.machine": machine_type.strip().replace(" ", "-") or "unknown"}
    labels.update(version_labels(inventory.driver_version, inventory.cuda_version))
    labels[PREFIX + "mig.capable"] = _bool(any(g.mig_capable for g in gpus))
    mps = config.sharing.strategy == "mps" and not any(g.mig_enabled for g in gpus)
    labels[PREFIX + "mps.capable"] = _bool(mps)
    labels.update(_full_gpu_labels(gpus, config.sharing))
    strategy = config.flags.mig_strategy
    if strategy != "none":
        labels[PREFIX + "mig.strategy"] = strategy
        labels.update(_single_labels(gpus, config.sharing) if strategy == "single" else {})
        labels.update(_mixed_labels(gpus, config.sharing) if strategy == "mixed" else {})
    mode = _gpu_mode(gpus[0])
    if mode is not None:
        labels[PREFIX + "gpu.mode"] = mode
    return labels


def sanitise(text: str) -> str:
    """A product name part as GFD writes it in a label value."""
    return "-".join(_INVALID_PRODUCT_CHARS.sub("", text).split())


def arch_family(major: int, minor: int) -> str:
    """GFD's architecture name of a CUDA compute capability."""
    if major == 7:
        return "volta" if minor < 5 else "turing"
    if major == 8:
        return "ampere" if minor < 9 else "ada-lovelace"
    families = {1: "tesla", 2: "fermi", 3: "kepler", 5: "maxwell", 6: "pascal", 9: "hopper"}
    families.update({10: "blackwell", 12: "blackwell"})
    return families.get(major, "undefined")


def version_labels(driver_version: str, cuda_version: tuple[int, int] | None) -> dict[str, str]:
    """Driver and CUDA labels, under GFD's deprecated and current names; {} parts that are unknown.

    `cuda_version` is the driver's CUDA version as Inventory.cuda_version decodes it, (12, 4).
    """
    labels: dict[str, str] = {}
    parts = driver_version.split(".") if driver_version else []
    if 2 <= len(parts) <= 3:
        major, minor, rev = parts[0], parts[1], parts[2] if len(parts) == 3 else ""
        labels.update(
            {
                "cuda.driver.major": major,
                "cuda.driver.minor": minor,
                "cuda.driver.rev": rev,
                "cuda.driver-version.major": major,
                "cuda.driver-version.minor": minor,
                "cuda.driver-version.revision": rev,
                "cuda.driver-version.full": driver_version,
            }
        )
    if cuda_version is not None:
        major_n, minor_n = cuda_version
        labels.update(
            {
                "cuda.runtime.major": str(major_n),
                "cuda.runtime.minor": str(minor_n),
                "cuda.runtime-version.major": str(major_n),
                "cuda.runtime-version.minor": str(minor_n),
                "cuda.runtime-version.full": f"{major_n}.{minor_n}",
            }
        )
    return {PREFIX + key: value for key, value in labels.items()}


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


def _full_gpu_labels(gpus: Sequence[Gpu], sharing: Sharing) -> dict[str, str]:
    named = [g for g in gpus if g.name]
    counts: dict[str, int] = {}
    for gpu in named:
        counts[gpu.name] = counts.get(gpu.name, 0) + 1
    labels: dict[str, str] = {}
    # Later models override earlier ones key by key, as GFD's merge does: MIG-mode GPUs first, then whole
    # GPUs; within each, the lowest-indexed GPU's model last, so it wins.
    for mig_mode in (True, False):
        first_of_model: dict[str, Gpu] = {}
        for gpu in named:
            if gpu.mig_enabled == mig_mode:
                first_of_model.setdefault(gpu.name, gpu)
        for gpu in sorted(first_of_model.values(), key=lambda g: -g.index):
            resource = _Resource(GPU_RESOURCE, None if mig_mode else sharing)
            labels.update(_gpu_labels(resource, gpu, counts[gpu.name]))
    return labels


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
    labels = resource.base(count, [parent.name, "MIG", mig.profile])
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
    """Per MIG profile, in discovery order: its first device, that device's GPU, and the device count."""
    found: dict[str, tuple[MigDevice, Gpu, int]] = {}
    for gpu in gpus:
        for mig in gpu.mig_devices:
            first, parent, count = found.get(mig.profile, (mig, gpu, 0))
            found[mig.profile] = (first, parent, count + 1)
    return found


def _single_labels(gpus: Sequence[Gpu], sharing: Sharing) -> dict[str, str]:
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
        }
    [(mig, parent, count)] = profiles.values()
    return _mig_labels(_Resource(GPU_RESOURCE, sharing), mig, parent, count)


def _mixed_labels(gpus: Sequence[Gpu], sharing: Sharing) -> dict[str, str]:
    labels: dict[str, str] = {}
    for profile, (mig, parent, count) in _profiles(gpus).items():
        labels.update(_mig_labels(_Resource(f"{PREFIX}mig-{profile}", sharing), mig, parent, count))
    return labels


def _gpu_mode(gpu: Gpu) -> str | None:
    if gpu.pci_class is None:
        return None
    return _PCI_CLASS_MODES.get(gpu.pci_class, "unknown")


def _bool(value: bool) -> str:
    return "true" if value else "false"
