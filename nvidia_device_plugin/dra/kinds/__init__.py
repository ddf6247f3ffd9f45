"""The kinds of device DRA publishes, one module each (gpu.py, mig.py), behind one small Protocol.

As NVIDIA's DRA driver types its allocatable devices (`AllocatableDevice.Type()`: gpu, mig, ...) and
dra-example-driver keeps one profile per kind, a kind says everything that differs between kinds: which of
a GPU's devices it publishes and their names, their kind-specific attributes and capacity, the DeviceClass
that selects them, and the physical device behind one (for its CDI spec). A new kind (a VFIO device) is
one new module here and one entry in dra/names.py's `KINDS`; the dynamic-MIG partition (partition.py)
takes the place of the GPU and static MIG kinds on the GPUs it applies to (dra/names.py's `kinds_of`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from nvidia_device_plugin.devices import Gpu, MigDevice, MigPlacementOption
from nvidia_device_plugin.plans.resources import AdvertisedDevice

Json = dict[str, Any]


@dataclass(frozen=True)
class DraDevice:
    """What a published DRA device name stands for on this node: a device of one kind on one GPU."""

    name: str
    gpu: Gpu
    mig: MigDevice | None
    kind: DeviceKind
    placement: MigPlacementOption | None = None  # a dynamic-MIG partition's placement (kinds/partition.py)

    @property
    def uuid(self) -> str:
        return self.kind.uuid(self)


class DeviceKind(Protocol):
    @property
    def name(self) -> str:
        """The device's `type` attribute: "gpu", "mig"."""
        ...

    @property
    def device_class(self) -> str:
        """The DeviceClass whose selector picks this kind (`type == <name>`)."""
        ...

    def devices(self, gpu: Gpu) -> list[DraDevice]:
        """This kind's devices on `gpu`, in publishing order (none where the GPU publishes another kind)."""
        ...

    def uuid(self, device: DraDevice) -> str: ...

    def attributes(self, device: DraDevice) -> Json:
        """`type`, `uuid` and the kind's own attributes (attributes.py adds those every kind shares)."""
        ...

    def capacity(self, device: DraDevice) -> Json: ...

    def advertised(self, device: DraDevice) -> AdvertisedDevice:
        """The physical device behind `device`, as the device plugin and cdi/ name it (unshared)."""
        ...
