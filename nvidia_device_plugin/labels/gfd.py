"""NVIDIA GPU Feature Discovery's label set, computed from the inventory and config the plugin serves.

The rules are GFD's (k8s-device-plugin v0.20, `internal/lm`); docs/labels.md lists every label. Where
GFD is odd, the oddity is kept, because selectors in clusters are written against what GFD publishes:

- `nvidia.com/gpu.count` counts every physical GPU of the labelled model, MIG-enabled ones included, even
  under the mixed strategy (a node with 3 MIG-enabled A100s and 1 whole A100 says `gpu.count=4`).
- GPUs in MIG mode get whole-GPU labels without sharing: `gpu.replicas=0`, `sharing-strategy=none`;
  a whole GPU of the same model overrides them with the sharing config's values.
- `gpu.product` gets `-SHARED` only when the resource is shared (replicas > 1) AND not renamed
  (`rename` or `renameByDefault` drop the suffix: the renamed resource already says it is shared).
  `replicas: 1` is "not shared" (GFD refuses such a file; we accept it and label it as unshared).
- Product names and `gpu.machine` are sanitised GFD's way: characters other than `A-Za-z0-9-_. ` are
  dropped, runs of blanks become one `-` (`Standard PC (Q35 + ICH9, 2009)` -> `Standard-PC-Q35-ICH9-2009`).
- MIG profiles are named as in their resource name, `+` written as `.`: a `1g.18gb+me` device is
  `nvidia.com/mig-1g.18gb.me.count` (mixed) and `...-MIG-1g.18gb.me` in a product.
- `mig.strategy` is only published for single and mixed. Under single, a node that breaks the strategy
  (a MIG-enabled GPU without MIG devices, MIG and non-MIG GPUs, several profiles) gets
  `gpu.product=<model>-MIG-INVALID` with `count`, `replicas` and `memory` 0 and `sharing-strategy` empty.
- `gpu.mode` is `compute` when every GPU is a 3D controller (PCI class 0x030200), `graphics` when every
  GPU is a VGA controller (0x030000), else `unknown` (classes that differ, or one that cannot be read).
- `gpu.family` is `undefined` for compute capabilities GFD does not know (4.x, 11.x).
- When several GPU models are on one node, GFD labels one of them: the model discovered last (the
  highest-indexed GPU's; MIG-mode GPUs only when no whole GPU exists). The count is that model's.
- `gpu.clique` is `<cluster UUID>.<clique ID>` when the GPUs are attached to a multi-node NVLink fabric
  (nvml/fabric.py says when), left out when none is or when they disagree (GFD logs a warning).
- `vgpu.present` is `false` on a node whose GPUs are not vGPUs, `true` with the host driver's version and
  branch on a vGPU guest.

Where GFD would fail the whole run (and publish nothing), the label that cannot be computed is left out
and the rest published: an unreadable compute capability drops family/compute labels, an unknown
driver or CUDA version drops the version labels, an unreadable fabric drops `gpu.clique`, a PCI config
space that cannot be read whole (an unprivileged container) drops `vgpu.*`, and MPS sharing on a node with
MIG-enabled GPUs gives `mps.capable=false`. A GPU lost at start does not take the model's labels with it:
they come from the GPUs that could be read, as GFD's do. GPUs whose name could not be read are not
labelled by model.
"""

from __future__ import annotations

from collections.abc import Sequence

from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import Config, advertises_mig_devices
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.labels.gfd_resources import (
    GPU_RESOURCE,
    PREFIX,
    arch_family,
    full_gpu_labels,
    mig_name,
    mixed_labels,
    sanitise,
    single_labels,
)

__all__ = ["GPU_RESOURCE", "PREFIX", "arch_family", "gfd_labels", "mig_name", "sanitise", "version_labels"]

_PCI_CLASS_MODES = {"0x030000": "graphics", "0x030200": "compute"}


def gfd_labels(inventory: Inventory, config: Config, machine_type: str = "unknown") -> dict[str, str]:
    """GFD's labels for this node (without `gfd.timestamp`); empty when there are no GPUs."""
    gpus = inventory.gpus
    if not gpus:
        return {}
    labels = {PREFIX + "gpu.machine": sanitise(machine_type)}
    labels.update(version_labels(inventory.driver_version, inventory.cuda_version))
    labels[PREFIX + "mig.capable"] = _bool(any(g.mig_capable for g in gpus))
    mps = sharing_mode(config.sharing.strategy).needs_control_daemon and not any(g.mig_enabled for g in gpus)
    labels[PREFIX + "mps.capable"] = _bool(mps)
    labels.update(full_gpu_labels(gpus, config.sharing))
    strategy = config.flags.mig_strategy
    if advertises_mig_devices(strategy):
        labels[PREFIX + "mig.strategy"] = strategy
        labels.update(single_labels(gpus, config.sharing) if strategy == "single" else {})
        labels.update(mixed_labels(gpus, config.sharing) if strategy == "mixed" else {})
    labels[PREFIX + "gpu.mode"] = gpu_mode(gpus)
    labels.update(clique_labels(gpus))
    labels.update(vgpu_labels(gpus))
    return labels


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


def gpu_mode(gpus: Sequence[Gpu]) -> str:
    """GFD's gpu.mode over the GPUs that could be read (a GPU lost at start has no say)."""
    classes = {g.pci_class for g in gpus if not g.lost}
    if len(classes) != 1:
        return "unknown"  # classes that differ, or no GPU could be read
    [pci_class] = classes
    return "unknown" if pci_class is None else _PCI_CLASS_MODES.get(pci_class, "unknown")


def clique_labels(gpus: Sequence[Gpu]) -> dict[str, str]:
    """`gpu.clique` when the fabric-attached GPUs agree on one cluster UUID and one clique ID."""
    fabrics = [g.fabric for g in gpus if g.fabric is not None]
    clusters = {f.cluster_uuid for f in fabrics}
    cliques = {f.clique_id for f in fabrics}
    if len(clusters) != 1 or len(cliques) != 1:
        return {}
    return {PREFIX + "gpu.clique": f"{clusters.pop()}.{cliques.pop()}"}


def vgpu_labels(gpus: Sequence[Gpu]) -> dict[str, str]:
    """`vgpu.present` and, on a vGPU guest, the host driver's version and branch."""
    vgpus = [g.vgpu for g in gpus if g.vgpu is not None]
    if vgpus:
        info = vgpus[-1]  # GFD keeps the last vGPU's
        labels = {PREFIX + "vgpu.present": "true"}
        for key, value in (("version", info.host_driver_version), ("branch", info.host_driver_branch)):
            if value:  # a capability without the host driver's record: GFD fails, we leave these out
                labels[f"{PREFIX}vgpu.host-driver-{key}"] = sanitise(value)
        return labels
    readable = [g for g in gpus if not g.lost]
    if readable and all(g.vgpu_checked for g in readable):
        return {PREFIX + "vgpu.present": "false"}
    return {}


def _bool(value: bool) -> str:
    return "true" if value else "false"
