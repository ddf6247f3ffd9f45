"""The DRA mode once on: one owner per GPU, the ResourceSlices, the kubelet DRA plugin.

The daemon's DRA side (dra/side.py) makes a `DraMode` when a config first turns `dra.enabled` on, and
keeps it while the process runs (turning it off hands every GPU back to the device plugin through the same
handover). Fed by the same path as the device plugin: each served snapshot (`serve`) and each health change
(`on_health_change`). It owns three workers: "dra-slices" (dra/publisher.py), "dra-handover" (reads
kubelet's pod-resources API while a GPU moves, dra/ownership.py) and the kubelet plugin (dra/kubelet/): the
plugin reads the node through `node_view` (a `NodeDevices`, never blocking), and the handover reads the
plugin's prepared claims, and the claims on disk (dra/claims_on_disk.py: per-claim CDI specs, a checkpoint
set aside), so that a GPU with a claim does not go back to the device plugin.

The kubelet plugin sets up the sharing a claim's opaque config asks for (dra/kubelet/claim_sharing.py)
through the daemon's NVML session: time-slices as the session sets them (nvidia-smi on a node, the
simulator's under --simulate), a control daemon per MPS claim under the config's MPS root (`mpsRoot`, as
the config was when DRA was turned on: a claim's daemon does not move), with its GPU's compute mode set to
EXCLUSIVE_PROCESS while it runs and back to DEFAULT after, as `mps-control-daemon` does.

The device plugin serves `plugin_plans(plans)`: the plans without the GPUs it does not own now; when a
GPU changes sides, `on_owners_changed` asks the daemon to serve again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.base.workers import Worker
from nvidia_device_plugin.config.v1 import Flags
from nvidia_device_plugin.devices import Gpu, Inventory
from nvidia_device_plugin.dra.claims_on_disk import claims_on_disk, gpus_of_devices
from nvidia_device_plugin.dra.device_health import device_health
from nvidia_device_plugin.dra.names import DRIVER_NAME, DraDevice, published_devices
from nvidia_device_plugin.dra.options import DraOptions
from nvidia_device_plugin.dra.ownership import DEVICE_PLUGIN, DRA, Owners, Reading, gpus_held, wanted_owners
from nvidia_device_plugin.dra.podresources import KubeletRestarting, PodResourcesReader
from nvidia_device_plugin.dra.publisher import SliceApi, SlicePublisher
from nvidia_device_plugin.dra.slices import node_counter_sets, node_devices
from nvidia_device_plugin.dra.taints import HealthTaints
from nvidia_device_plugin.events import HealthChange
from nvidia_device_plugin.health.registry import Verdict
from nvidia_device_plugin.plans.resources import ResourcePlan
from nvidia_device_plugin.snapshot import Snapshot

if TYPE_CHECKING:
    from nvidia_device_plugin.dra.kubelet.claim_sharing import ClaimSharing
    from nvidia_device_plugin.dra.kubelet.model import NodeDevices
    from nvidia_device_plugin.dra.kubelet.plugin import DraKubeletPlugin
    from nvidia_device_plugin.nvml.session import NvmlSession

log = logging.getLogger(__name__)

# The daemon's reload funnel for a change read back from the node: (reason, served inventory -> new one).
InventoryEditor = Callable[[str, Callable[[Inventory], Inventory]], object]


class DraMode:
    def __init__(
        self,
        options: DraOptions,
        verdicts: Callable[[], Mapping[str, Verdict]],
        on_owners_changed: Callable[[], None],
        nvml: NvmlSession | None = None,
        cdi_spec_dir: Path = Path("/var/run/cdi"),
        mps_root: str = Flags.mps_root,
        edit_inventory: InventoryEditor | None = None,
    ) -> None:
        self.options = options
        # The daemon's reload funnel for a change dynamic MIG made (on_gpu_changed); None: not told.
        self._edit_inventory = edit_inventory
        self._on_owners_changed = on_owners_changed
        self._host = nvml.host if nvml is not None else None
        self._lock = threading.Lock()
        self._owners = Owners()
        self._snapshot: Snapshot | None = None
        self._verdicts = verdicts
        self.taints = HealthTaints(verdicts)
        self._failures = FailureLog(log)
        self._wake = threading.Event()
        client = options.api_client()
        api = options.slice_api(client) if options.slice_api is not None else _kube_slice_api(client)
        self.publisher = SlicePublisher(api, options.node_name, on_published=self._on_published)
        self.handover = Worker("dra-handover", target=self._handover, interrupt=self._wake.set)
        self._pods = PodResourcesReader(options.pod_resources_socket, options.kubelet_restart_grace_s)
        self._cdi_spec_dir = cdi_spec_dir
        self._checkpoint_path = options.kubelet_plugins_dir / DRIVER_NAME / "checkpoint.json"
        self._nvml = nvml  # dynamic MIG makes claims' MIG devices through it; None: it refuses them
        sharing = claim_sharing(nvml, mps_root) if nvml is not None else None
        self.kubelet = self._kubelet_plugin(cdi_spec_dir, client, sharing)

    def workers(self) -> list[Worker]:
        return [self.publisher, self.handover, self.kubelet]

    # ---- fed by the daemon ---------------------------------------------------------------------------

    def serve(self, snapshot: Snapshot) -> None:
        """Take `snapshot`'s owners (checked by `check` before) and publish what DRA owns of it."""
        wanted = wanted_owners(snapshot.inventory, snapshot.config.dra)
        with self._lock:
            self._snapshot = snapshot
            self._owners.want(wanted)
            moving = bool(self._owners.moving())
        self._publish()
        if moving:
            self._wake.set()

    def on_health_change(self, change: HealthChange) -> None:
        self._publish()  # the registry calls only on a flip: a taint appeared or went

    def plugin_plans(self, plans: Sequence[ResourcePlan]) -> tuple[ResourcePlan, ...]:
        """`plans` with only the devices of GPUs the device plugin owns now (empty plans stay: their
        resource is then advertised with no device, so the node's allocatable for it is 0)."""
        with self._lock:
            mine = self._owners.served_by(DEVICE_PLUGIN)
        return tuple(replace(p, devices=tuple(d for d in p.devices if d.gpu_uuid in mine)) for p in plans)

    def devices(self) -> dict[str, DraDevice]:
        """The DRA devices this node serves now, by name (what a claim's results may name)."""
        with self._lock:
            snapshot, owned = self._snapshot, self._owners.served_by(DRA)
        if snapshot is None:
            return {}
        published = published_devices(snapshot.inventory, snapshot.config.dra.dynamic_mig)
        return {n: d for n, d in published.items() if d.gpu.uuid in owned}

    def dynamic_mig(self) -> bool:
        """Whether the config served now has dynamic MIG on."""
        with self._lock:
            snapshot = self._snapshot
        return snapshot is not None and snapshot.config.dra.enabled and snapshot.config.dra.dynamic_mig

    def owners(self) -> dict[str, str]:
        """GPU UUID -> its side now, or "moving to <side>"."""
        with self._lock:
            moving = {uuid: f"moving to {side}" for uuid, side in self._owners.moving().items()}
            return {**moving, **self._owners.effective}

    # ---- internals -------------------------------------------------------------------------------

    def _kubelet_plugin(
        self, cdi_spec_dir: Path, api_client: Any, sharing: ClaimSharing | None
    ) -> DraKubeletPlugin:
        """The kubelet DRA plugin: registration in the kubelet registry dir, its endpoint under the plugins
        dir, claims read through `api_client`, per-claim CDI specs in `cdi_spec_dir`, the devices' health
        streamed to kubelet from what `_publish` reports, claims' sharing set up by `sharing` (None: a
        claim asking for sharing is refused)."""
        from nvidia_device_plugin.dra.kubelet.claims import ApiClaimSource
        from nvidia_device_plugin.dra.kubelet.dynamic_mig import DynamicMig, NvmlMigControl
        from nvidia_device_plugin.dra.kubelet.plugin import DraKubeletPlugin

        plugins_dir = self.options.kubelet_plugins_dir
        nvml = self._nvml
        return DraKubeletPlugin(
            plugins_dir=plugins_dir,
            registry_dir=self.options.kubelet_registry_dir,
            claims=ApiClaimSource(api_client),
            node=self.node_view,
            cdi_spec_dir=cdi_spec_dir,
            checkpoint_path=self._checkpoint_path,
            sharing=sharing,
            dynamic_mig=DynamicMig(NvmlMigControl(nvml), self.on_gpu_changed) if nvml is not None else None,
        )

    def on_gpu_changed(self, gpu: Gpu) -> None:
        """A GPU read again after dynamic MIG made or destroyed a MIG device on it: handed to the daemon's
        one reload funnel (`edit_inventory`), whose snapshot, with this GPU in place of the one served,
        comes back through `serve` (and so reaches labels, metrics and health too)."""
        from nvidia_device_plugin.dra.kubelet.dynamic_mig import with_gpu

        with self._lock:
            snapshot = self._snapshot
        if snapshot is None or self._edit_inventory is None:
            return
        before = next((g for g in snapshot.inventory.gpus if g.uuid == gpu.uuid), None)
        had = {m.uuid for m in before.mig_devices} if before is not None else set()
        now = {m.uuid for m in gpu.mig_devices}
        changes = [f"MIG device {u} made" for u in sorted(now - had)]
        changes += [f"MIG device {u} destroyed" for u in sorted(had - now)]
        reason = f"{'; '.join(changes) or 'MIG devices read again'} on GPU {gpu.index}"
        self._edit_inventory(reason, lambda inventory: with_gpu(inventory, gpu))

    def node_view(self) -> NodeDevices | None:
        """The node as the kubelet plugin's prepare sees it now; None before the first snapshot (or
        without NVML's host paths)."""
        from nvidia_device_plugin.cdi.model import CdiSettings
        from nvidia_device_plugin.dra.kubelet.claim_sharing import config_sharing_of
        from nvidia_device_plugin.dra.kubelet.model import NodeDevices

        with self._lock:
            snapshot = self._snapshot
        if snapshot is None or self._host is None:
            return None
        return NodeDevices(
            self.devices(),
            snapshot.inventory,
            self._host,
            CdiSettings.from_config(snapshot.config),
            config_sharing_of(snapshot.plans),  # so a claim's sharing stays off the config's MPS GPUs
        )

    def _prepared_devices(self) -> set[str]:
        """DRA device names of the claims prepared on this node now."""
        return {d for names in self.kubelet.prepared().values() for d in names}

    def _publish(self) -> None:
        with self._lock:
            snapshot, owned = self._snapshot, self._owners.served_by(DRA)
        if snapshot is None:
            return
        dynamic = snapshot.config.dra.dynamic_mig
        devices = node_devices(snapshot.inventory, snapshot.plans, owned, self.taints, dynamic)
        self.publisher.publish(devices, owned, node_counter_sets(snapshot.inventory, owned, dynamic))
        # The same devices and verdicts as the slices' taints, to kubelet's health stream.
        disabled = snapshot.config.health.disabled
        self.kubelet.health_feed.refresh(
            lambda: device_health(self.devices(), self._verdicts(), self.options.node_name, disabled)
        )

    def _on_published(self, gpus: frozenset[str]) -> None:
        with self._lock:
            moving_to_plugin = any(side == DEVICE_PLUGIN for side in self._owners.moving().values())
        if moving_to_plugin:
            self._wake.set()  # a GPU waiting to leave the slices may go now

    def _handover(self, stop: threading.Event) -> None:
        while not stop.is_set():
            with self._lock:
                moving = bool(self._owners.moving())
            if not moving:
                self._wake.wait()
                self._wake.clear()
                continue
            reading = self._read()
            if reading is not None:
                with self._lock:
                    moved = self._owners.step(reading)
                if moved:
                    self._moved(moved)
            stop.wait(self.options.poll_interval_s)

    def _moved(self, moved: list[str]) -> None:
        owners = self.owners()
        for uuid in moved:
            log.info(
                "GPU %s is now served by %s (it was free)",
                uuid,
                "DRA" if owners[uuid] == DRA else "the device plugin",
            )
        self._on_owners_changed()
        self._publish()

    def _read(self) -> Reading | None:
        """One look at what the node's pods hold; None (logged once per reason) when kubelet cannot say."""
        with self._lock:
            snapshot = self._snapshot
        if snapshot is None:
            return None
        try:
            pods = self._pods.read()
        except Exception as exc:  # the socket's problem, or a bug: the GPU waits, the thread goes on
            with self._lock:
                self._owners.interrupt()  # "free on two readings in a row": this one breaks the row
            level = logging.INFO if isinstance(exc, KubeletRestarting) else logging.WARNING
            self._failures.report("pod-resources", f"DRA handover waits: {exc}", level)
            return None
        if self._failures.clear("pod-resources"):
            log.info("DRA handover: kubelet's pod-resources API answers again, and its answers count")
        inventory = snapshot.inventory
        published = self.publisher.published
        all_gpus = frozenset(g.uuid for g in inventory.gpus)
        return Reading(
            gpus_held(pods.plugin_ids, inventory),
            self._held_by_dra(inventory, pods.dra_devices),
            all_gpus if published is None else published,
        )

    def _held_by_dra(self, inventory: Inventory, reported: frozenset[tuple[str, str, str]]) -> frozenset[str]:
        """GPUs with a DRA claim: pod-resources reports it, our kubelet plugin prepared it, or its CDI spec
        is on disk (a kubelet without DRA in pod-resources, a checkpoint set aside). Every GPU while what
        the disk says is unknown."""
        claimed = {
            d for driver, pool, d in reported if driver == DRIVER_NAME and pool == self.options.node_name
        }
        claimed |= self._prepared_devices()
        with self._lock:
            leaving_dra = any(side == DEVICE_PLUGIN for side in self._owners.moving().values())
        if leaving_dra:  # the disk is read only while a GPU waits to leave DRA
            on_disk = claims_on_disk(self._cdi_spec_dir, self._checkpoint_path)
            if on_disk.unknown is not None:
                self._failures.report(
                    "claims-on-disk", f"no GPU goes back to the device plugin: {on_disk.unknown}"
                )
                return frozenset(g.uuid for g in inventory.gpus)
            if self._failures.clear("claims-on-disk"):
                log.info("DRA handover: the claims on disk can be read again")
            claimed |= on_disk.devices
        return gpus_of_devices(claimed, inventory)


def claim_sharing(nvml: NvmlSession, mps_root: str) -> ClaimSharing:
    """What sets claims' sharing up on the node `nvml` reads: its time-slices, and MPS control daemons under
    `mps_root` around which a GPU's compute mode is EXCLUSIVE_PROCESS (so that no process opens it beside
    the MPS server, as `mps-control-daemon` sets it), and DEFAULT again once the daemon quit."""
    from nvidia_device_plugin.dra.kubelet.claim_sharing import ClaimSharing
    from nvidia_device_plugin.nvml.compute_mode import ComputeMode, set_compute_mode
    from nvidia_device_plugin.sharing.mps_daemon import MpsDaemonSpec

    def compute_mode(mode: ComputeMode) -> Callable[[MpsDaemonSpec], None]:
        return lambda spec: set_compute_mode(nvml.nv, spec.gpu_uuid, mode)

    return ClaimSharing(
        time_slice=nvml.time_slices(),
        mps_root=mps_root,
        prepare_gpu=compute_mode("EXCLUSIVE_PROCESS"),
        release_gpu=compute_mode("DEFAULT"),
    )


def _kube_slice_api(client: Any) -> SliceApi:
    from nvidia_device_plugin.dra.apiserver import KubeSliceApi

    return KubeSliceApi(client)
