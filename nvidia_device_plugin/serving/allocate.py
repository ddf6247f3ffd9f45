"""Allocate responses: what kubelet hands the container runtime for the devices it picked.

Each container request is checked, then answered the way NVIDIA's k8s-device-plugin answers it
(internal/plugin/server.go, getAllocateResponse), one ContainerAllocateResponse per request, in order:

* The runtime device IDs are the physical devices behind the requested IDs, deduplicated, in request
  order: GPU or MIG UUIDs (`deviceIDStrategy: uuid`) or "3" / "3:1" (`index`).
* `cdi-annotations`: one annotation `<cdiAnnotationPrefix>nvidia-device-plugin_<response-id>` whose value
  is the comma-separated CDI names `k8s.device-plugin.nvidia.com/gpu=<runtime id>` (the key is built as
  the CDI library's AnnotationKey builds it). The response ID is a UUID derived from the resource and the
  requested IDs, where NVIDIA draws a random one. It is still unique within a container and gives
  kubelet's retries the same answer. `cdi-cri`: the same names as `cdi_devices`. With `gdrcopyEnabled`,
  `gdsEnabled` or `mofedEnabled`, `k8s.device-plugin.nvidia.com/gdrcopy=all`, `.../gds=all` and
  `.../mofed=all` follow the GPUs, in that order.
* MPS replicas get the environment and mounts of `sharing/mps.py`; n replicas of the GPU in one container
  (with `failRequestsGreaterThanOne: false`) get n shares of it. A request spanning GPUs is refused.
* `gdrcopyEnabled` / `gdsEnabled` / `mofedEnabled` set NVIDIA_GDRCOPY / NVIDIA_GDS / NVIDIA_MOFED=enabled,
  under every strategy.
* When every strategy is a CDI one, that is all: NVIDIA_VISIBLE_DEVICES is left unset (the CDI spec sets
  it) and no device specs are passed, as in NVIDIA's plugin.
* `envvar`: NVIDIA_VISIBLE_DEVICES=<id>,<id>.
* `volume-mounts`: NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices, plus one mount per device
  of /dev/null at /var/run/nvidia-container-devices/<id>. With `envvar` too, this value wins, as in NVIDIA.
* `passDeviceSpecs`: the control nodes /dev/nvidiactl, /dev/nvidia-uvm, /dev/nvidia-uvm-tools and
  /dev/nvidia-modeset, each only when it exists on this node. Then /dev/nvidia<minor> of each GPU, and
  for a MIG device also the capability nodes /dev/nvidia-caps/nvidia-cap<N> of its GPU instance and
  compute instance. N comes from the `DeviceFileMinor:` line of
  <procRoot>/driver/nvidia/capabilities/gpu<minor>/mig/gi<gi>[/ci<ci>]/access. Host paths are those
  paths under `nvidiaDevRoot`, permissions "rw".
* `imex.channelIDs: [0]`: /dev/nvidia-caps-imex-channels/channel0 (host path under `nvidiaDevRoot`, "rw")
  in every container response, under every strategy, when the node exists; as NVIDIA v0.20 does. With
  `imex.required`, a missing channel is refused at start and on reload (`imex_problem`).
"""

from __future__ import annotations

import posixpath
import uuid
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.api.v1beta1 import api_pb2
from nvidia_device_plugin.config.v1 import (
    Config,
    DeviceIdStrategy,
    DeviceListStrategies,
    SharedAllocationPolicy,
    uses_cdi,
)
from nvidia_device_plugin.devices import Gpu, Inventory, MigDevice
from nvidia_device_plugin.errors import AllocationError
from nvidia_device_plugin.health.registry import DeviceHealth, UnhealthyIds
from nvidia_device_plugin.nvml.host import REAL_HOST, HostPaths
from nvidia_device_plugin.resources import AdvertisedDevice, ResourcePlan
from nvidia_device_plugin.sharing import mps

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = "/var/run/nvidia-container-devices"
VOLUME_MOUNTS_HOST_PATH = "/dev/null"
CDI_VENDOR = "k8s.device-plugin.nvidia.com"
CDI_GPU_CLASS = "gpu"
CDI_ANNOTATION_PLUGIN = "nvidia-device-plugin"
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset")
MIG_CAPS_DEVICE_DIR = "/dev/nvidia-caps"
IMEX_CHANNEL_DEVICE_DIR = "/dev/nvidia-caps-imex-channels"
# Seeds the response IDs, so the same request always yields the same annotation key.
_RESPONSE_ID_NAMESPACE = uuid.UUID("6f1c2f0e-6a43-4f4e-9d0a-3b1f2c9f7d10")


@dataclass(frozen=True)
class AllocationSettings:
    """The config fields that shape an Allocate response (defaults are NVIDIA's).

    The strategies were validated by the config loader; their Literal types keep other callers honest.
    """

    device_list_strategy: DeviceListStrategies = ("envvar",)
    device_id_strategy: DeviceIdStrategy = "uuid"
    pass_device_specs: bool = False
    nvidia_dev_root: str = "/"
    cdi_annotation_prefix: str = "cdi.k8s.io/"
    mps_root: str = "/run/nvidia/mps"
    gdrcopy_enabled: bool = False
    gds_enabled: bool = False
    mofed_enabled: bool = False
    proc_root: str = "/proc"  # where the MIG capability files are read
    device_node_probe_root: str = "/"  # where the optional control nodes are looked for
    shared_devices_allocation_policy: SharedAllocationPolicy = "distributed"
    imex_channel_ids: tuple[int, ...] = ()
    imex_required: bool = False

    @classmethod
    def from_config(cls, config: Config, host: HostPaths = REAL_HOST) -> AllocationSettings:
        """The settings `config` asks for, reading the node's kernel interfaces under `host`."""
        flags = config.flags
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
        )

    @property
    def cdi_enabled(self) -> bool:
        return uses_cdi(self.device_list_strategy)

    @property
    def only_cdi(self) -> bool:
        return all(s.startswith("cdi-") for s in self.device_list_strategy)


class AllocationIndex:
    """One plan's devices by ID (and the inventory facts device specs need), built in O(devices).

    Build it once per plan and pass it to `allocate` so that each call costs O(request), not O(plan).
    """

    def __init__(self, plan: ResourcePlan, inventory: Inventory | None = None) -> None:
        self.plan = plan
        self._devices = {d.id: d for d in plan.devices}
        self._replicas = mps.replica_counts(plan)
        self._inventory = inventory

    def device(self, device_id: str) -> AdvertisedDevice | None:
        return self._devices.get(device_id)

    def replicas_of(self, physical_uuid: str) -> int:
        return self._replicas.get(physical_uuid, 1)

    def gpu(self, gpu_uuid: str) -> Gpu | None:
        return self._inventory.gpu(gpu_uuid) if self._inventory is not None else None

    def mig(self, mig_uuid: str) -> MigDevice | None:
        return self._inventory.mig_device(mig_uuid) if self._inventory is not None else None


def allocate(
    plan: ResourcePlan,
    requests: Sequence[Sequence[str]],
    settings: AllocationSettings,
    unhealthy: DeviceHealth | Container[str] = (),
    *,
    inventory: Inventory | None = None,
    index: AllocationIndex | None = None,
) -> api_pb2.AllocateResponse:
    """Check and answer kubelet's AllocateRequest (one device-ID list per container) for `plan`.

    `unhealthy` answers which devices are unhealthy now: a DeviceHealth (the health registry), or the
    advertised IDs / physical UUIDs that are down (a GPU that is down takes its replicas and MIG devices
    with it: health.registry decides that). `inventory` is needed only for passDeviceSpecs (GPU minor
    numbers, MIG instance IDs). Pass a prebuilt `index` for the plan to skip rebuilding it (its
    inventory is then the one used).
    """
    if index is None:
        index = AllocationIndex(plan, inventory)
    elif index.plan is not plan:
        raise ValueError(
            f"the AllocationIndex passed to allocate() was built for {index.plan.name}, not {plan.name}"
        )
    # The registry answers for itself; a plain collection of physical UUIDs is frozen for O(1) lookups.
    if isinstance(unhealthy, DeviceHealth):
        health = unhealthy
    else:
        health = UnhealthyIds(frozenset(unhealthy) if isinstance(unhealthy, Sequence) else unhealthy)
    return api_pb2.AllocateResponse(
        container_responses=[
            _container_response(i, list(ids), index, settings, health) for i, ids in enumerate(requests)
        ]
    )


def _container_response(
    i: int, ids: list[str], index: AllocationIndex, settings: AllocationSettings, health: DeviceHealth
) -> api_pb2.ContainerAllocateResponse:
    devices = _checked_devices(i, ids, index, health)
    plan = index.plan
    physical = _physical_devices(devices)
    runtime_ids = [runtime_device_id(d, settings.device_id_strategy) for d in physical]

    response = api_pb2.ContainerAllocateResponse()
    if settings.cdi_enabled:
        names = _cdi_device_names(runtime_ids, settings)
        if "cdi-annotations" in settings.device_list_strategy:
            response.annotations[_cdi_annotation_key(settings.cdi_annotation_prefix, plan.name, ids)] = (
                ",".join(names)
            )
        if "cdi-cri" in settings.device_list_strategy:
            response.cdi_devices.extend(api_pb2.CDIDevice(name=name) for name in names)
    if plan.sharing == "mps":
        # n replicas of the GPU -> n shares of its memory and SMs (_checked_devices keeps them on one GPU).
        shares = Counter(d.physical_uuid for d in devices if d.replica is not None)
        for dev in physical:
            if dev.replica is None:
                continue
            replicas = index.replicas_of(dev.physical_uuid)
            response.envs.update(
                mps.client_envs(plan.name, dev.memory_bytes, replicas, shares[dev.physical_uuid])
            )
            response.mounts.extend(mps.client_mounts(plan.name, dev.physical_uuid, settings.mps_root))
    if settings.gdrcopy_enabled:
        response.envs["NVIDIA_GDRCOPY"] = "enabled"
    if settings.gds_enabled:
        response.envs["NVIDIA_GDS"] = "enabled"
    if settings.mofed_enabled:
        response.envs["NVIDIA_MOFED"] = "enabled"
    response.devices.extend(
        api_pb2.DeviceSpec(
            container_path=path, host_path=_under(settings.nvidia_dev_root, path), permissions="rw"
        )
        for path in present_imex_channels(settings)
    )
    if settings.only_cdi:
        return response

    if "envvar" in settings.device_list_strategy:
        response.envs[VISIBLE_DEVICES_ENV] = ",".join(runtime_ids)
    if "volume-mounts" in settings.device_list_strategy:
        response.envs[VISIBLE_DEVICES_ENV] = VOLUME_MOUNTS_ROOT
        response.mounts.extend(
            api_pb2.Mount(
                container_path=posixpath.join(VOLUME_MOUNTS_ROOT, rid), host_path=VOLUME_MOUNTS_HOST_PATH
            )
            for rid in runtime_ids
        )
    if settings.pass_device_specs:
        response.devices.extend(
            api_pb2.DeviceSpec(
                container_path=path, host_path=_under(settings.nvidia_dev_root, path), permissions="rw"
            )
            for path in _device_paths(i, physical, index, settings)
        )
    return response


def runtime_device_id(device: AdvertisedDevice, strategy: DeviceIdStrategy) -> str:
    """The ID the runtime gets for `device`, and its CDI device name: a UUID, or "3" / "3:1" (index)."""
    return device.physical_uuid if strategy == "uuid" else device.index_id


def imex_channel_path(channel_id: int) -> str:
    return f"{IMEX_CHANNEL_DEVICE_DIR}/channel{channel_id}"


def present_imex_channels(settings: AllocationSettings) -> list[str]:
    """The configured IMEX channel device nodes that exist on this node (container paths)."""
    return [
        path
        for path in map(imex_channel_path, settings.imex_channel_ids)
        if Path(_under(settings.device_node_probe_root, path)).exists()
    ]


def imex_problem(settings: AllocationSettings) -> str | None:
    """Why the config's required IMEX channels cannot be given to containers; None when they can."""
    if not settings.imex_required:
        return None
    present = set(present_imex_channels(settings))
    missing = [p for p in map(imex_channel_path, settings.imex_channel_ids) if p not in present]
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
    present = present_imex_channels(settings)
    paths = [imex_channel_path(c) for c in settings.imex_channel_ids]
    state = "present" if len(present) == len(paths) else "missing, not injected until it appears"
    required = "required" if settings.imex_required else "not required"
    return f"imex: injecting {', '.join(paths)} into every container ({state}; {required})"


def _checked_devices(
    i: int, ids: list[str], index: AllocationIndex, health: DeviceHealth
) -> list[AdvertisedDevice]:
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
    if plan.sharing == "mps":
        # One control daemon per GPU, and one MPS pipe per resource in the container (sharing/mps.py).
        gpus = list(dict.fromkeys(f"GPU {d.gpu_index} ({d.physical_uuid})" for d in devices))
        if len(gpus) > 1:
            raise AllocationError(
                f"{where}: MPS replicas of one container must be on one GPU (a container has one MPS pipe "
                f"per resource), but the request spans {', '.join(gpus)}"
            )
    return devices


def _physical_devices(devices: list[AdvertisedDevice]) -> list[AdvertisedDevice]:
    """The first requested device for each physical device, in request order."""
    first: dict[str, AdvertisedDevice] = {}
    for dev in devices:
        first.setdefault(dev.physical_uuid, dev)
    return list(first.values())


def _cdi_device_names(runtime_ids: list[str], settings: AllocationSettings) -> list[str]:
    names = [f"{CDI_VENDOR}/{CDI_GPU_CLASS}={rid}" for rid in runtime_ids]
    for mode, enabled in (
        ("gdrcopy", settings.gdrcopy_enabled),
        ("gds", settings.gds_enabled),
        ("mofed", settings.mofed_enabled),
    ):
        if enabled:
            names.append(f"{CDI_VENDOR}/{mode}=all")
    return names


def _cdi_annotation_key(prefix: str, resource_name: str, ids: list[str]) -> str:
    response_id = uuid.uuid5(_RESPONSE_ID_NAMESPACE, resource_name + "\n" + "\n".join(ids))
    # The CDI library's AnnotationKey: "<plugin>_<device id with '/' as '_'>", at most 63 characters.
    return f"{prefix}{CDI_ANNOTATION_PLUGIN}_{response_id}"


def _device_paths(
    i: int, physical: list[AdvertisedDevice], index: AllocationIndex, settings: AllocationSettings
) -> list[str]:
    paths: dict[str, None] = {}
    for node in CONTROL_DEVICE_NODES:
        if Path(_under(settings.device_node_probe_root, node)).exists():
            paths[node] = None
    for dev in physical:
        gpu = index.gpu(dev.gpu_uuid)
        if gpu is None:
            raise AllocationError(
                f"container_requests[{i}]: passDeviceSpecs needs the minor number of GPU {dev.gpu_uuid}, "
                "which is not in the inventory allocate() was given"
            )
        paths[f"/dev/nvidia{gpu.minor}"] = None
        if dev.kind == "mig":
            mig = index.mig(dev.physical_uuid)
            if mig is None:
                raise AllocationError(
                    f"container_requests[{i}]: passDeviceSpecs needs the GPU and compute instance IDs of "
                    f"MIG device {dev.physical_uuid}, which is not in the inventory allocate() was given"
                )
            if mig.caps_minors is not None:  # resolved at discovery from nvidia-caps/mig-minors
                for cap_minor in mig.caps_minors:
                    paths[f"{MIG_CAPS_DEVICE_DIR}/nvidia-cap{cap_minor}"] = None
                continue
            caps = posixpath.join(
                settings.proc_root,
                "driver/nvidia/capabilities",
                f"gpu{gpu.minor}",
                "mig",
                f"gi{mig.gpu_instance_id}",
            )
            paths[mig_capability_device_node(posixpath.join(caps, "access"))] = None
            paths[
                mig_capability_device_node(posixpath.join(caps, f"ci{mig.compute_instance_id}", "access"))
            ] = None
    return list(paths)


def mig_capability_device_node(access_file: str) -> str:
    """The /dev/nvidia-caps node that grants the capability whose proc `access` file is given."""
    try:
        text = Path(access_file).read_text()
    except OSError as exc:
        raise AllocationError(
            f"cannot read MIG capability file {access_file}: {exc.strerror or exc}; "
            "is MIG configured and /proc/driver/nvidia visible to the plugin?"
        ) from exc
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "DeviceFileMinor":
            try:
                return f"{MIG_CAPS_DEVICE_DIR}/nvidia-cap{int(value.strip())}"
            except ValueError:
                break
    raise AllocationError(f"MIG capability file {access_file} has no valid 'DeviceFileMinor: <N>' line")


def _under(root: str, path: str) -> str:
    """`path` (absolute) inside `root`, as Go's filepath.Join(root, path) puts it."""
    return posixpath.normpath(posixpath.join(root, path.lstrip("/")))
