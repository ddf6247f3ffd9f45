"""Allocate responses: what kubelet hands the container runtime for the devices it picked.

Each container request is checked (`_checked_request`), then answered the way NVIDIA's k8s-device-plugin
answers it (internal/plugin/server.go, getAllocateResponse), one ContainerAllocateResponse per request, in
order. The runtime device IDs are the physical devices behind the requested IDs, deduplicated, in request
order: GPU or MIG UUIDs (`deviceIDStrategy: uuid`) or "3" / "3:1" (`index`). The response then passes
through these steps, in this order (`_container_response`, as NVIDIA's updateResponseFor... steps):

* `_update_for_cdi`: `cdi-annotations`: one annotation
  `<cdiAnnotationPrefix>nvidia-device-plugin_<response-id>` whose value is the comma-separated CDI names
  `k8s.device-plugin.nvidia.com/gpu=<runtime id>` (the key is built as the CDI library's AnnotationKey
  builds it). The response ID is a UUID derived from the resource and the requested IDs, where NVIDIA
  draws a random one. It is still unique within a container and gives kubelet's retries the same answer.
  `cdi-cri`: the same names as `cdi_devices`. The IMEX channels of the snapshot's imex-channel spec follow
  the GPUs (`k8s.device-plugin.nvidia.com/imex-channel=0`), then, with `gdrcopyEnabled`, `gdsEnabled` or
  `mofedEnabled`, `k8s.device-plugin.nvidia.com/gdrcopy=all`, `.../gds=all` and `.../mofed=all`, in that
  order (cdi/model.py names them all), except a mode whose spec was left out (its kernel nodes absent).
* `_update_for_mps`: MPS replicas get the environment and mounts of `sharing/mps.py`; n replicas of the
  GPU in one container (with `failRequestsGreaterThanOne: false`) get n shares of it. A request spanning
  GPUs is refused.
* `_update_for_extra_modes`: `gdrcopyEnabled` / `gdsEnabled` / `mofedEnabled` set NVIDIA_GDRCOPY /
  NVIDIA_GDS / NVIDIA_MOFED=enabled, under every strategy.
* When every strategy is a CDI one, that is all: NVIDIA_VISIBLE_DEVICES is left unset (the CDI spec sets
  it) and no device specs are passed, as in NVIDIA's plugin.
* `_update_for_envvar`: `envvar`: NVIDIA_VISIBLE_DEVICES=<id>,<id>.
* `_update_for_volume_mounts`: `volume-mounts`: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices,
  plus one mount per device of /dev/null at /var/run/nvidia-container-devices/<id>. With `envvar` too,
  this value wins, as in NVIDIA.
* `_update_for_device_specs`: `passDeviceSpecs`: the control nodes /dev/nvidiactl, /dev/nvidia-uvm,
  /dev/nvidia-uvm-tools and /dev/nvidia-modeset, each only when it exists on this node. Then
  /dev/nvidia<minor> of each GPU (/dev/dxg on a WSL2 node), and for a MIG device also the capability
  nodes of its GPU instance and compute instance (devnodes.py says where their minors come from). Host
  paths are those paths under `nvidiaDevRoot`, permissions "rw".
* `_update_for_imex`: `imex.channelIDs: [0]`, with channel 0 present on the node: as NVIDIA v0.20 gives it
  to every container under the non-CDI strategies, NVIDIA_IMEX_CHANNELS=0 (`envvar`), a /dev/null mount
  at /var/run/nvidia-container-devices/imex/0 (`volume-mounts`) and the device spec of
  /dev/nvidia-caps-imex-channels/channel0 (host path under `nvidiaDevRoot`, "rw"; `passDeviceSpecs`).
  Under the CDI strategies the channel is a CDI name (above). With `imex.required`, a missing channel is
  refused at start and on reload (serving/imex.py).
"""

from __future__ import annotations

import posixpath
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from nvidia_device_plugin import devnodes
from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.base.errors import AllocationError
from nvidia_device_plugin.base.uuids import name_uuid
from nvidia_device_plugin.cdi.model import (
    GPU_CLASS,
    IMEX_CLASS,
    CdiPlan,
    cdi_device_name,
    enabled_extra_modes,
    runtime_device_id,
)
from nvidia_device_plugin.config.sharing_modes import sharing_mode
from nvidia_device_plugin.config.v1 import (
    Config,
    DeviceIdStrategy,
    DeviceListStrategies,
    SharedAllocationPolicy,
    all_cdi_enabled,
    any_cdi_enabled,
)
from nvidia_device_plugin.devices import Inventory
from nvidia_device_plugin.health.registry import DeviceHealth
from nvidia_device_plugin.nvml.host import REAL_HOST, HostPaths
from nvidia_device_plugin.plans.resources import AdvertisedDevice, ResourcePlan
from nvidia_device_plugin.sharing import mps

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
IMEX_CHANNELS_ENV = "NVIDIA_IMEX_CHANNELS"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"
# Seeds the response IDs, so the same request always yields the same annotation key.
_RESPONSE_ID_NAMESPACE = "6f1c2f0e-6a43-4f4e-9d0a-3b1f2c9f7d10"


@dataclass(frozen=True)
class AllocationSettings:
    """The config fields that shape an Allocate response, built by `from_config` only.

    No field has a default of its own: the defaults are the config's (config/v1.py's Flags), so the two
    cannot drift. The strategies were validated by the config loader; their Literal types keep other
    callers honest.
    """

    device_list_strategy: DeviceListStrategies
    device_id_strategy: DeviceIdStrategy
    pass_device_specs: bool
    nvidia_dev_root: str
    cdi_annotation_prefix: str
    mps_root: str
    gdrcopy_enabled: bool
    gds_enabled: bool
    mofed_enabled: bool
    proc_root: str  # where the MIG capability files are read
    device_node_probe_root: str  # where the optional control nodes are looked for
    shared_devices_allocation_policy: SharedAllocationPolicy
    imex_channel_ids: tuple[int, ...]
    imex_required: bool
    # What the snapshot's CDI specs define (cdi/), so Allocate names nothing else: the IMEX channels of the
    # imex-channel spec, and the extra modes whose spec was left out (their kernel nodes absent).
    cdi_imex_channels: tuple[int, ...]
    cdi_dropped_extra_modes: tuple[str, ...]

    @classmethod
    def from_config(
        cls, config: Config, host: HostPaths = REAL_HOST, cdi: CdiPlan | None = None
    ) -> AllocationSettings:
        """The settings `config` asks for, reading the node's kernel interfaces under `host`; `cdi` is the
        snapshot's CDI plan, whose specs define the CDI names Allocate may return."""
        flags = config.flags
        defined = cdi is not None and cdi.problem is None
        return cls(
            device_list_strategy=flags.plugin.device_list_strategy,
            device_id_strategy=flags.plugin.device_id_strategy,
            pass_device_specs=flags.plugin.pass_device_specs,
            nvidia_dev_root=flags.nvidia_dev_root,
            cdi_annotation_prefix=flags.plugin.cdi_annotation_prefix,
            mps_root=flags.mps_root,
            gdrcopy_enabled=flags.gdrcopy_enabled,
            gds_enabled=flags.gds_enabled,
            mofed_enabled=flags.mofed_enabled,
            proc_root=str(host.proc_root),
            device_node_probe_root=str(host.dev_root),
            shared_devices_allocation_policy=flags.plugin.shared_devices_allocation_policy,
            imex_channel_ids=config.imex.channel_ids,
            imex_required=config.imex.required,
            cdi_imex_channels=cdi.imex_channels if cdi is not None and defined else (),
            cdi_dropped_extra_modes=tuple(
                m
                for m in enabled_extra_modes(flags)
                if defined and cdi is not None and m not in cdi.extra_modes
            ),
        )


class AllocationIndex:
    """One plan's devices by ID, with the inventory device specs read, built in O(devices).

    Build it once per plan and pass it to `allocate` so that each call costs O(request), not O(plan).
    """

    def __init__(self, plan: ResourcePlan, inventory: Inventory) -> None:
        self.plan = plan
        self.inventory = inventory
        self._devices = {d.id: d for d in plan.devices}

    def device(self, device_id: str) -> AdvertisedDevice | None:
        return self._devices.get(device_id)


def allocate(
    index: AllocationIndex,
    requests: Sequence[Sequence[str]],
    settings: AllocationSettings,
    health: DeviceHealth,
) -> api_pb2.AllocateResponse:
    """Check and answer kubelet's AllocateRequest (one device-ID list per container) for `index.plan`.

    `health` answers, per requested device, whether it is healthy now (the health registry: a GPU that
    is down takes its replicas and MIG devices with it).
    """
    return api_pb2.AllocateResponse(
        container_responses=[
            _container_response(_checked_request(i, list(ids), index, settings, health))
            for i, ids in enumerate(requests)
        ]
    )


@dataclass(frozen=True)
class _Request:
    """One container's request, checked: what every step of its response reads."""

    where: str  # "container_requests[<i>]", for messages
    ids: tuple[str, ...]  # as requested
    devices: tuple[AdvertisedDevice, ...]  # behind `ids`, in request order
    physical: tuple[AdvertisedDevice, ...]  # the first of `devices` per physical device
    runtime_ids: tuple[str, ...]  # of `physical`, as the runtime names them
    plan: ResourcePlan
    inventory: Inventory
    settings: AllocationSettings


_Response = api_pb2.ContainerAllocateResponse


def _container_response(request: _Request) -> _Response:
    """The response's steps, in order (which orders its mounts and device specs), as NVIDIA's."""
    response = api_pb2.ContainerAllocateResponse()
    _update_for_cdi(response, request)
    _update_for_mps(response, request)
    _update_for_extra_modes(response, request)
    if all_cdi_enabled(request.settings.device_list_strategy):
        return response  # the CDI spec sets NVIDIA_VISIBLE_DEVICES and the device nodes
    _update_for_envvar(response, request)
    _update_for_volume_mounts(response, request)
    _update_for_device_specs(response, request)
    _update_for_imex(response, request)
    return response


def _update_for_cdi(response: _Response, request: _Request) -> None:
    """`cdi-annotations`: one annotation naming the CDI devices; `cdi-cri`: the same names as CDI devices."""
    settings = request.settings
    if not any_cdi_enabled(settings.device_list_strategy):
        return
    names = [cdi_device_name(GPU_CLASS, rid) for rid in request.runtime_ids]
    names += [cdi_device_name(IMEX_CLASS, str(channel)) for channel in settings.cdi_imex_channels]
    names += [
        cdi_device_name(mode, "all")
        for mode in enabled_extra_modes(settings)
        if mode not in settings.cdi_dropped_extra_modes
    ]
    if "cdi-annotations" in settings.device_list_strategy:
        key = _cdi_annotation_key(settings.cdi_annotation_prefix, request.plan.name, request.ids)
        response.annotations[key] = ",".join(names)
    if "cdi-cri" in settings.device_list_strategy:
        response.cdi_devices.extend(api_pb2.CDIDevice(name=name) for name in names)


def _cdi_annotation_key(prefix: str, resource_name: str, ids: Sequence[str]) -> str:
    response_id = name_uuid(_RESPONSE_ID_NAMESPACE, resource_name + "\n" + "\n".join(ids))
    # The CDI library's AnnotationKey: "<plugin>_<device id with '/' as '_'>", at most 63 characters.
    return f"{prefix}{CDI_ANNOTATION_PLUGIN}_{response_id}"


def _update_for_mps(response: _Response, request: _Request) -> None:
    """MPS replicas: the client environment and mounts of their GPU's control daemon (sharing/mps.py)."""
    plan = request.plan
    if not sharing_mode(plan.sharing).needs_control_daemon:
        return
    # n replicas of the GPU -> n shares of its memory and SMs (_checked_request keeps them on one GPU).
    shares = Counter(d.physical_uuid for d in request.devices if d.replica is not None)
    for dev in request.physical:
        if dev.replica is None:
            continue
        response.envs.update(
            mps.client_envs(plan.name, dev.memory_bytes, plan.replicas, shares[dev.physical_uuid])
        )
        response.mounts.extend(mps.client_mounts(plan.name, dev.physical_uuid, request.settings.mps_root))


def _update_for_extra_modes(response: _Response, request: _Request) -> None:
    """gdrcopyEnabled / gdsEnabled / mofedEnabled: NVIDIA_GDRCOPY / NVIDIA_GDS / NVIDIA_MOFED=enabled."""
    for mode in enabled_extra_modes(request.settings):
        response.envs[f"NVIDIA_{mode.upper()}"] = "enabled"


def _update_for_imex(response: _Response, request: _Request) -> None:
    """The configured IMEX channels that exist on this node, in the form each non-CDI strategy takes."""
    settings = request.settings
    probe_root = settings.device_node_probe_root
    channels = [
        c for c in settings.imex_channel_ids if devnodes.exists(probe_root, devnodes.imex_channel_path(c))
    ]
    if not channels:
        return
    strategies = settings.device_list_strategy
    if "envvar" in strategies:
        response.envs[IMEX_CHANNELS_ENV] = ",".join(map(str, channels))
    if "volume-mounts" in strategies:
        response.mounts.extend(
            api_pb2.Mount(
                container_path=posixpath.join(VOLUME_MOUNTS_ROOT, "imex", str(c)),
                host_path=VOLUME_MOUNTS_HOST_PATH,
            )
            for c in channels
        )
    if settings.pass_device_specs:
        response.devices.extend(_device_spec(devnodes.imex_channel_path(c), settings) for c in channels)


def _update_for_envvar(response: _Response, request: _Request) -> None:
    if "envvar" in request.settings.device_list_strategy:
        response.envs[VISIBLE_DEVICES_ENV] = ",".join(request.runtime_ids)


def _update_for_volume_mounts(response: _Response, request: _Request) -> None:
    """`volume-mounts`: /dev/null at one path per device; after envvar, so its variable wins."""
    if "volume-mounts" not in request.settings.device_list_strategy:
        return
    response.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
    response.mounts.extend(
        api_pb2.Mount(
            container_path=posixpath.join(VOLUME_MOUNTS_ROOT, rid), host_path=VOLUME_MOUNTS_HOST_PATH
        )
        for rid in request.runtime_ids
    )


def _update_for_device_specs(response: _Response, request: _Request) -> None:
    """`passDeviceSpecs`: the control nodes present, then each device's own nodes (devnodes.py)."""
    settings = request.settings
    if not settings.pass_device_specs:
        return
    paths = dict.fromkeys(devnodes.present_control_nodes(settings.device_node_probe_root))
    for dev in request.physical:
        paths.update(dict.fromkeys(_device_nodes(request, dev)))
    response.devices.extend(_device_spec(path, settings) for path in paths)


def _device_nodes(request: _Request, dev: AdvertisedDevice) -> list[str]:
    gpu = request.inventory.gpu(dev.gpu_uuid)
    if gpu is None:
        raise AllocationError(
            f"{request.where}: passDeviceSpecs needs the minor number of GPU {dev.gpu_uuid}, "
            "which is not in the inventory allocate() was given"
        )
    nodes = list(devnodes.gpu_device_nodes(gpu.minor, request.settings.device_node_probe_root))
    if dev.kind == "mig":
        mig = request.inventory.mig_device(dev.physical_uuid)
        if mig is None:
            raise AllocationError(
                f"{request.where}: passDeviceSpecs needs the GPU and compute instance IDs of "
                f"MIG device {dev.physical_uuid}, which is not in the inventory allocate() was given"
            )
        nodes += devnodes.mig_capability_nodes(mig, gpu.minor, request.settings.proc_root)
    return nodes


def _device_spec(path: str, settings: AllocationSettings) -> api_pb2.DeviceSpec:
    return api_pb2.DeviceSpec(
        container_path=path, host_path=devnodes.under(settings.nvidia_dev_root, path), permissions="rw"
    )


def _checked_request(
    i: int, ids: list[str], index: AllocationIndex, settings: AllocationSettings, health: DeviceHealth
) -> _Request:
    plan = index.plan
    where = f"container_requests[{i}]"
    if not ids:
        raise AllocationError(f"{where}: no device IDs requested for resource {plan.name}")
    if len(ids) > len(plan.devices):
        raise AllocationError(
            f"{where}: request for '{plan.name}: {len(ids)}' exceeds the {len(plan.devices)} devices "
            "the resource has"
        )
    devices: list[AdvertisedDevice] = []
    seen: set[str] = set()
    for device_id in ids:
        dev = index.device(device_id)
        if dev is None:
            raise AllocationError(f"{where}: unknown device ID '{device_id}' for resource {plan.name}")
        if device_id in seen:
            raise AllocationError(f"{where}: device ID '{device_id}' is requested more than once")
        seen.add(device_id)
        if not health.is_healthy(dev):
            raise AllocationError(f"{where}: device '{device_id}' is unhealthy")
        devices.append(dev)
    _check_sharing(where, plan, devices)
    first: dict[str, AdvertisedDevice] = {}
    for dev in devices:
        first.setdefault(dev.physical_uuid, dev)
    physical = tuple(first.values())
    return _Request(
        where=where,
        ids=tuple(ids),
        devices=tuple(devices),
        physical=physical,
        runtime_ids=tuple(runtime_device_id(d, settings.device_id_strategy) for d in physical),
        plan=plan,
        inventory=index.inventory,
        settings=settings,
    )


def _check_sharing(where: str, plan: ResourcePlan, devices: list[AdvertisedDevice]) -> None:
    # failRequestsGreaterThanOne (the default for MPS) refuses multi-device requests for replicas.
    if (
        plan.fail_requests_greater_than_one
        and len(devices) > 1
        and any(d.replica is not None for d in devices)
    ):
        raise AllocationError(
            f"{where}: request for '{plan.name}: {len(devices)}' too large: "
            "maximum request size for shared resources is 1"
        )
    if sharing_mode(plan.sharing).one_gpu_per_request:
        # One control daemon per GPU, and one MPS pipe per resource in the container (sharing/mps.py).
        gpus = list(dict.fromkeys(d.label for d in devices))
        if len(gpus) > 1:
            raise AllocationError(
                f"{where}: MPS replicas of one container must be on one GPU (a container has one MPS pipe "
                f"per resource), but the request spans {', '.join(gpus)}"
            )
