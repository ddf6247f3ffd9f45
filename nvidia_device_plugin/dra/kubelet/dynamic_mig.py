"""Dynamic MIG at Prepare and Unprepare: the MIG device of a claim's placement is made when the claim is
prepared and destroyed when it is unprepared, and nothing else is touched.

Prepare of a claim allocated a placement (dra/kinds/partition.py) with no MIG device yet: a "creating"
record goes into the claim's checkpoint entry, NVML makes the GPU instance at the placement and one compute
instance over it (nvml/mig_manager.py), the record becomes "made" (GPU and compute instance IDs, MIG UUID),
and the GPU is read again (one GPU, not a rediscovery) so the claim's CDI spec names the new device's
/dev/nvidia-caps nodes. A failure is the claim's, with NVML's reason; whatever this prepare made for the
claim is destroyed again before it answers. A placement taken by a MIG device this plugin did not make for
the claim (made by hand, by nvidia-mig-manager, for another claim) is refused naming that device.

Unprepare destroys exactly what the claim's records name, each found again by its GPU and compute instance
IDs and its placement (an instance ID of a destroyed instance is reused by the next one made). A record
"creating" (the daemon stopped, or NVML hung, mid-create) names no IDs: the instance at its placement is
taken as the claim's unless another claim recorded it.

At start (`adopt`) every record is checked against the GPU: a made instance still there is kept (never made
twice), one gone is dropped (its claim is prepared again when kubelet asks), a "creating" one becomes
"made" where its placement holds an instance no other claim recorded and is dropped where it holds none.
Whether kubelet still has each claim is then asked of the API in the background (dra/kubelet/
stale_claims.py): a claim it can no longer have is unprepared, its instances destroyed by `release`.
Otherwise instances are destroyed only when kubelet unprepares a claim whose pod is gone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Protocol

from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.dra.kinds.partition import Partition
from nvidia_device_plugin.dra.kubelet.checkpoint import CREATING, MADE, MigRecord
from nvidia_device_plugin.dra.kubelet.model import ClaimError, ClaimRef, NodeDevices
from nvidia_device_plugin.dra.names import DraDevice
from nvidia_device_plugin.nvml.discovery import rediscover_gpu
from nvidia_device_plugin.nvml.errors import NvmlErrorKind
from nvidia_device_plugin.nvml.mig_manager import MadeMigDevice, MigChangeFailed, MigManager
from nvidia_device_plugin.nvml.session import NvmlSession

log = logging.getLogger(__name__)

Records = tuple[MigRecord, ...]
Save = Callable[[Records], None]  # puts a claim's records into its checkpoint entry and saves it

_HINTS = {
    NvmlErrorKind.INSUFFICIENT_RESOURCES: "its memory slices are taken",
    NvmlErrorKind.IN_USE: "a process still holds it; kubelet retries the unprepare",
    NvmlErrorKind.NO_PERMISSION: "making and destroying MIG devices needs CAP_SYS_ADMIN in the plugin",
    NvmlErrorKind.STUCK: (
        "the driver did not answer within the NVML call deadline; an instance it makes later is found by "
        "the claim's next prepare or unprepare"
    ),
}


class MigControl(Protocol):
    """What dynamic MIG asks of NVML: make, destroy, and read one GPU again."""

    def create(self, gpu: int, profile: int, start: int) -> MadeMigDevice: ...

    def destroy(self, gpu: int, gi_id: int, ci_id: int) -> None: ...

    def reread(self, gpu: int) -> Gpu | None: ...


class NvmlMigControl:
    """MigControl over an NVML session: nvml/mig_manager.py's verbs, and discovery of one GPU."""

    def __init__(self, session: NvmlSession) -> None:
        self._session = session
        self._manager = MigManager(session.nv)

    def create(self, gpu: int, profile: int, start: int) -> MadeMigDevice:
        return self._manager.create(gpu, profile, start)

    def destroy(self, gpu: int, gi_id: int, ci_id: int) -> None:
        self._manager.destroy(gpu, gi_id, ci_id)

    def reread(self, gpu: int) -> Gpu | None:
        host = self._session.host
        return rediscover_gpu(self._session.nv, gpu, host.sysfs_root, host.proc_root)


def unmade(device: DraDevice) -> bool:
    """Whether `device` is a dynamic-MIG placement without its MIG device: made at Prepare."""
    return isinstance(device.kind, Partition) and device.mig is None


def with_gpu(inventory: Inventory, fresh: Gpu) -> Inventory:
    """`inventory` with the MIG state of `fresh` (a GPU read again); the rest of the GPU as it was."""

    def updated(gpu: Gpu) -> Gpu:
        if gpu.uuid != fresh.uuid:
            return gpu
        return replace(
            gpu,
            mig_enabled=fresh.mig_enabled,
            mig_devices=fresh.mig_devices,
            mig_placements=fresh.mig_placements,
            mig_memory_slices=fresh.mig_memory_slices,
        )

    return replace(inventory, gpus=tuple(map(updated, inventory.gpus)))


def _overlaps(mig: MigDevice, start: int, size: int) -> bool:
    return mig.placement is not None and mig.placement[0] < start + size and start < sum(mig.placement)


def _at_placement(gpu: Gpu | None, record: MigRecord) -> MigDevice | None:
    """The MIG device of `record`'s profile occupying exactly its placement on `gpu`."""
    where = (record.start, record.size)
    return next(
        (
            m
            for m in (gpu.mig_devices if gpu else ())
            if m.placement == where and m.gi_profile_info_id == record.gi_profile_id
        ),
        None,
    )


def _recorded(gpu: Gpu | None, record: MigRecord) -> MigDevice | None:
    """`record`'s made instance on `gpu`: its IDs, its placement and its UUID all still match."""
    found = _at_placement(gpu, record)
    ids = (record.gi_id, record.ci_id)
    if found is None or (found.gpu_instance_id, found.compute_instance_id) != ids:
        return None
    return found if found.uuid == record.mig_uuid else None


def _placement_text(record: MigRecord) -> str:
    last = record.start + record.size - 1
    slices = f"slice {record.start}" if record.size == 1 else f"slices {record.start}-{last}"
    return f"{record.profile} at {slices} of GPU {record.gpu_uuid}"


def _reason(exc: MigChangeFailed) -> str:
    hint = _HINTS.get(exc.kind)
    return f"{exc} [{exc.kind.name}]" + (f"; {hint}" if hint else "")


class _Stuck(ClaimError):
    """A create the driver did not answer in time: it may still make the instance."""


class ClaimRecords:
    """A claim's MIG records, saved into its checkpoint entry at every change."""

    def __init__(self, records: Records, save: Save) -> None:
        self.records = records
        self._save = save

    def put(self, record: MigRecord) -> None:
        """`record` in place of the one for its device (or added)."""
        self._set((*(r for r in self.records if r.device != record.device), record))

    def drop(self, record: MigRecord) -> None:
        self._set(tuple(r for r in self.records if r.device != record.device))

    def _set(self, records: Records) -> None:
        self._save(records)  # first: a failed save leaves the records as they were
        self.records = records


def _record_of(device: DraDevice) -> MigRecord:
    option = device.placement
    if option is None:  # a bug: partitions always have one
        raise ClaimError(f"{device.name} is a MIG partition without a placement")
    gpu = device.gpu
    return MigRecord(
        device.name,
        gpu.uuid,
        gpu.index,
        option.profile,
        option.gi_profile_id,
        option.start,
        option.size,
        CREATING,
    )


def _made_record(record: MigRecord, mig: MigDevice) -> MigRecord:
    return replace(
        record, state=MADE, gi_id=mig.gpu_instance_id, ci_id=mig.compute_instance_id, mig_uuid=mig.uuid
    )


def _unowned(gpu: Gpu | None, record: MigRecord, owners: Mapping[str, str]) -> MigDevice | None:
    """The instance at `record`'s placement unless another claim recorded it."""
    found = _at_placement(gpu, record)
    return found if found is not None and found.uuid not in owners else None


class DynamicMig:
    """Makes, destroys and adopts claims' MIG devices through `control`; `on_gpu_changed` is told each GPU
    read again after a change (what the daemon's inventory should see)."""

    def __init__(self, control: MigControl, on_gpu_changed: Callable[[Gpu], None] | None = None) -> None:
        self._control = control
        self._on_gpu_changed = on_gpu_changed

    # ---- Prepare ---------------------------------------------------------------------------------

    def make(
        self,
        ref: ClaimRef,
        devices: Sequence[DraDevice],
        node: NodeDevices,
        records: Records,
        save: Save,
        owners: Mapping[str, str],
    ) -> tuple[list[DraDevice], NodeDevices]:
        """`devices` with each unmade placement's MIG device made (or the one `records` already name), and
        `node` with their GPUs read again. `owners`: MIG UUID -> the label of the claim that made it (other
        claims). On failure what this call made is destroyed again (`save` keeps the records current) and
        ClaimError says why."""
        mine = ClaimRecords(records, save)
        result: list[DraDevice] = []
        for device in devices:
            if device.mig is not None and device.mig.uuid in owners:
                raise ClaimError(
                    f"{device.name} is MIG device {device.mig.uuid}, made for {owners[device.mig.uuid]}"
                )
            if not unmade(device):
                result.append(device)
                continue
            try:
                made, fresh = self._make_one(ref, device, mine, owners)
            except _Stuck:
                raise  # nothing is destroyed while the driver may still be making it: the records find it
            except ClaimError:
                self._undo(ref, mine.records, save, owners)
                raise
            node = replace(node, inventory=with_gpu(node.inventory, fresh))
            result.append(replace(device, gpu=node.inventory.gpu(fresh.uuid) or fresh, mig=made))
        return result, node

    def _make_one(
        self, ref: ClaimRef, device: DraDevice, mine: ClaimRecords, owners: Mapping[str, str]
    ) -> tuple[MigDevice, Gpu]:
        """The MIG device of `device`'s placement for claim `ref`, and its GPU read after."""
        earlier = next((r for r in mine.records if r.device == device.name), None)
        gpu = device.gpu
        if earlier is not None:  # made (or being made) by an earlier prepare of this claim
            fresh = self._reread(gpu.index, gpu.uuid, ref)
            found = _recorded(fresh, earlier) if earlier.state == MADE else _unowned(fresh, earlier, owners)
            if found is not None:
                mine.put(_made_record(earlier, found))
                return found, fresh
        record = _record_of(device)
        mine.put(record)  # "creating": found at start should the daemon stop during the create
        try:
            made = self._control.create(gpu.index, record.gi_profile_id, record.start)
        except MigChangeFailed as exc:
            if exc.kind is NvmlErrorKind.STUCK:  # it may still be made: the record stays to find it
                raise _Stuck(self._create_failed(record, exc, owners)) from None
            mine.drop(record)
            raise ClaimError(self._create_failed(record, exc, owners)) from None
        record = replace(record, state=MADE, gi_id=made.gi_id, ci_id=made.ci_id, mig_uuid=made.uuid)
        mine.put(record)
        log.info("made MIG device %s (%s) for %s", made.uuid, _placement_text(record), ref.label)
        fresh = self._reread(gpu.index, gpu.uuid, ref)
        found = _recorded(fresh, record)
        if found is None:
            raise ClaimError(
                f"MIG device {made.uuid} was made but reading GPU {gpu.uuid} again did not find it"
            )
        return found, fresh

    def _create_failed(self, record: MigRecord, exc: MigChangeFailed, owners: Mapping[str, str]) -> str:
        message = f"making the MIG device {_placement_text(record)} failed: {_reason(exc)}"
        if exc.kind is not NvmlErrorKind.INSUFFICIENT_RESOURCES:
            return message
        fresh = self._control.reread(record.gpu_index)
        taken = [m for m in (fresh.mig_devices if fresh else ()) if _overlaps(m, record.start, record.size)]
        for mig in taken:
            whose = f"made for {owners[mig.uuid]}" if mig.uuid in owners else "not made by this plugin"
            where = f"slices {mig.placement[0]}-{sum(mig.placement) - 1}" if mig.placement else "?"
            message += (
                f"; the placement is taken by MIG device {mig.uuid} ({mig.profile} at {where}, {whose})"
            )
        return message

    def _reread(self, index: int, uuid: str, ref: ClaimRef | None = None) -> Gpu:
        fresh = self._control.reread(index)
        if fresh is None or fresh.uuid != uuid or fresh.lost:  # lost: its MIG devices are not known
            what = f" for {ref.label}" if ref is not None else ""
            raise ClaimError(
                f"GPU {uuid} (index {index}) cannot be read again{what} (lost, or a call is stuck)"
            )
        if self._on_gpu_changed is not None:
            self._on_gpu_changed(fresh)
        return fresh

    def _undo(self, ref: ClaimRef, records: Records, save: Save, owners: Mapping[str, str]) -> None:
        """Destroy what `records` made after a failed prepare; a failure here is logged (the first one is
        the claim's error) and its record kept for the unprepare."""
        try:
            self.release(ref, records, save, owners)
        except ClaimError as exc:
            log.warning("undoing the MIG devices made for %s: %s", ref.label, exc)

    # ---- Unprepare -------------------------------------------------------------------------------

    def release(self, ref: ClaimRef, records: Records, save: Save, owners: Mapping[str, str]) -> None:
        """Destroy each MIG device `records` name (last made first), dropping each record once its device
        is gone; ClaimError (NVML's reason) at the first that cannot be destroyed, its record kept."""
        mine = ClaimRecords(records, save)
        for record in reversed(records):
            gpu = self._reread(record.gpu_index, record.gpu_uuid, ref)
            found = _recorded(gpu, record) if record.state == MADE else _unowned(gpu, record, owners)
            if found is not None:
                try:
                    self._control.destroy(record.gpu_index, found.gpu_instance_id, found.compute_instance_id)
                except MigChangeFailed as exc:
                    what = f"destroying MIG device {found.uuid} ({_placement_text(record)})"
                    raise ClaimError(f"{what} failed: {_reason(exc)}") from None
                log.info("destroyed MIG device %s (%s) of %s", found.uuid, _placement_text(record), ref.label)
                self._reread(record.gpu_index, record.gpu_uuid, ref)
            mine.drop(record)

    # ---- start -----------------------------------------------------------------------------------

    def adopt(self, claims: Iterable[tuple[ClaimRef, Records]]) -> dict[str, Records]:
        """Each claim's records checked against its GPUs (read once each), by claim UID: made instances
        still there kept, gone ones dropped, "creating" ones made "made" where an instance no other claim
        recorded holds their placement and dropped elsewhere."""
        claims = list(claims)
        gpus: dict[int, Gpu | None] = {}
        for _, records in claims:
            for index in {r.gpu_index for r in records} - gpus.keys():
                gpus[index] = self._control.reread(index)
        made = {r.mig_uuid for _, records in claims for r in records if r.state == MADE}
        adopted: dict[str, Records] = {}
        for ref, records in claims:
            kept: list[MigRecord] = []
            for record in records:
                gpu = gpus.get(record.gpu_index)
                gpu = gpu if gpu is not None and gpu.uuid == record.gpu_uuid else None
                found = _recorded(gpu, record) if record.state == MADE else _at_placement(gpu, record)
                if found is None or (record.state == CREATING and found.uuid in made):
                    log.warning(
                        "%s: no MIG device of its own at %s (gone, or never made); record dropped",
                        ref.label,
                        _placement_text(record),
                    )
                    continue
                made.add(found.uuid)
                kept.append(_made_record(record, found))
                log.info("adopted MIG device %s (%s) of %s", found.uuid, _placement_text(record), ref.label)
            adopted[ref.uid] = tuple(kept)
        return adopted
