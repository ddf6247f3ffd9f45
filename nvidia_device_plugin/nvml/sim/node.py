"""Simulated node descriptions: built-in presets and YAML node files, parsed into frozen NodeSpec values.

The presets are JSON (a node file's format is YAML, and JSON is YAML): read with the standard library, so a
simulated run that names a preset loads no PyYAML, as a real node with no config file loads none. PyYAML
took 12 ms of such a run's start-up; the bench's start-up figure is meant to be the plugin's, not the
simulator's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvidia_device_plugin.base.boundedio import read_text
from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.base.uuids import name_uuid
from nvidia_device_plugin.nvml.mig_profiles import ATTRIBUTE_SUFFIXES
from nvidia_device_plugin.nvml.sim.placement import check_layout

# The presets ship as package data, files beside this module in every install (the package is never run
# from a zip); a path, not importlib.resources, which loads zipfile and its compressors into every run.
_PRESETS = Path(__file__).parent / "presets"
_MAX_NODE_FILE_BYTES = 4 * 1024 * 1024
_UUID_NAMESPACE = "6b1e0c8a-52c3-4f4e-9d0c-0c2d5b7a9e11"
_PROFILE = re.compile(
    r"^(?:(?P<c>\d+)c\.)?(?P<g>\d+)g\.(?P<gb>\d+)gb"
    rf"(?P<attr>{'|'.join(re.escape(suffix) for suffix in ATTRIBUTE_SUFFIXES)})?$"
)
# NVSwitches live in a PCI domain of their own, so no GPU bus ID can collide with one.
NVSWITCH_PCI_DOMAIN = "0000fffe"
# Product names whose GPUs can run MIG (A30, A100, H100, H200, H20, B200, GB200, B300, ...).
_MIG_CAPABLE = re.compile(r"A100|A30|H100|H200|H20|GH200|B200|B300|GB200|GB300")
# CUDA compute capability by product name, first match wins (nvmlDeviceGetCudaComputeCapability's answer).
_COMPUTE_CAPABILITY = (
    (re.compile(r"GB300|B300|GB200|B200|B100"), (10, 0)),
    (re.compile(r"RTX PRO 6000 Blackwell|RTX 50\d0"), (12, 0)),
    (re.compile(r"H100|H200|H20|H800|GH200"), (9, 0)),
    (re.compile(r"L40|L4\b|L20|RTX 6000 Ada|RTX 40\d0"), (8, 9)),
    (re.compile(r"A100|A30|A800"), (8, 0)),
    (re.compile(r"A10\b|A40|A16|A2\b|RTX A\d000|RTX 30\d0"), (8, 6)),
    (re.compile(r"T4|Quadro RTX|RTX 20\d0"), (7, 5)),
    (re.compile(r"V100|TITAN V"), (7, 0)),
    (re.compile(r"P100"), (6, 0)),
    (re.compile(r"P4\b|P40"), (6, 1)),
)
# PCI classes of NVIDIA GPUs in sysfs: data-center GPUs are 3D controllers, display GPUs VGA controllers.
PCI_CLASS_3D = "0x030200"
PCI_CLASS_VGA = "0x030000"
_PCI_CLASSES = (PCI_CLASS_3D, PCI_CLASS_VGA)
_BUS_ID = re.compile(r"^[0-9a-fA-F]{8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-9a-fA-F]$")

_NODE_KEYS = {
    "description",  # free text: what the node is (the presets say which machine they stand for)
    "name",
    "wsl",
    "driver_version",
    "cuda_driver_version",
    "nvswitch_links",
    "gpus",
    "nvlinks",
    "unprivileged_container",
    "fabric",
    "hangs",
}
_GPU_KEYS = {
    "name",
    "uuid",
    "memory_mib",
    "pci_bus_id",
    "numa_node",
    "pcie_switch",
    "mig",
    "mig_capable",
    "events",
    "minor",
    "compute_capability",
    "pci_class",
    "fabric",
    "vgpu",
}
_FABRIC_KEYS = {"cluster_uuid", "clique_id", "state", "status"}
# nvmlGpuFabricState_t by the name a node file gives it.
FABRIC_STATES = {"not_supported": 0, "not_started": 1, "in_progress": 2, "completed": 3}


@dataclass(frozen=True)
class MigSpec:
    """A MIG device of a simulated GPU."""

    profile: str  # "1g.10gb", "1c.2g.20gb" or "1g.10gb+me"
    uuid: str
    gpu_slices: int
    compute_slices: int
    memory_gb: int
    slot: int = 0  # index for nvmlDeviceGetMigDeviceHandleByIndex (a null in the YAML list leaves a gap)
    suffix: str = ""  # "+me", "-me", "+gfx", "+me.all"
    # Set for instances made at run time (nvml/sim/mig_management.py), and on every instance of a GPU once
    # one was made or destroyed: the driver's GPU instance ID and (start, size) stay where they were made.
    gi_id: int | None = None
    placement: tuple[int, int] | None = None


@dataclass(frozen=True)
class FabricSpec:
    """What nvmlDeviceGetGpuFabricInfo answers for a GPU on an NVLink fabric (GB200 NVL, NVLink Switch)."""

    cluster_uuid: bytes  # 16 bytes; all zero: the GPU belongs to no multi-node fabric
    clique_id: int
    state: int = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
    status: int = 0  # the fabric manager's verdict, an NVML return code (0: success)


@dataclass(frozen=True)
class GpuSpec:
    """A simulated GPU, as its node file (or preset) describes it."""

    index: int
    name: str
    uuid: str
    memory_mib: int
    pci_bus_id: str
    numa_node: int  # -1: sysfs says unknown
    pcie_switch: int | None
    mig_capable: bool
    mig_enabled: bool
    mig: tuple[MigSpec, ...]
    events: bool
    minor: int = -1  # N of /dev/nvidiaN; the YAML default is the index
    compute_capability: tuple[int, int] | None = None  # None: NVML answers NOT_SUPPORTED
    pci_class: str = PCI_CLASS_3D
    fabric: FabricSpec | None = None  # None: nvmlDeviceGetGpuFabricInfo answers NOT_SUPPORTED
    vgpu: tuple[str, str] | None = None  # a vGPU guest's GPU: (host driver version, branch)


@dataclass(frozen=True)
class HangSpec:
    """A pynvml call that blocks from the start, as in a GPU reset:
    `hangs: [{call: nvmlDeviceGetMemoryInfo, gpu: 2, seconds: 30}]` (gpu left out: every call of that
    name; seconds left out: until released)."""

    call: str
    gpu: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class NodeSpec:
    """A simulated node: driver, GPUs, links and the faults it starts with."""

    name: str
    driver_version: str
    cuda_driver_version: int
    gpus: tuple[GpuSpec, ...]
    nvswitch_links: int  # NVLinks from every GPU to the NVSwitch fabric; 0 when there is none
    nvlinks: tuple[tuple[int, int, int], ...]  # direct GPU-GPU links: (a, b, lanes)
    # A container without CAP_SYS_ADMIN: MIG enumeration and MIG-attributed events answer NO_PERMISSION.
    unprivileged_container: bool = False
    hangs: tuple[HangSpec, ...] = ()  # calls that block from the simulator's start (SimulatorState.hang)
    # A WSL2 guest: the GPUs are reached through /dev/dxg (no /dev/nvidia* nodes, no nvidia-drm) and the
    # driver's user-space files are the Windows driver's, under /usr/lib/wsl.
    wsl: bool = False


def preset_names() -> list[str]:
    return sorted(f.name.removesuffix(".json") for f in _PRESETS.iterdir() if f.name.endswith(".json"))


def load_node(name_or_path: str) -> NodeSpec:
    """A preset by name (`dgx-a100`) or a YAML node file by path."""
    if name_or_path in preset_names():
        text = (_PRESETS / f"{name_or_path}.json").read_text()
        return parse_node(json.loads(text), source=f"preset {name_or_path}")
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(
            f"simulated node '{name_or_path}' is neither a preset ({', '.join(preset_names())}) nor a file"
        )
    return parse_node(_read_node_file(path), source=str(path))


def _read_node_file(path: Path) -> Any:
    """A node file's document: `yaml.safe_load`, through libyaml's loader where PyYAML was built with it (a
    node file in a quarter of the time); the same documents, the same errors."""
    import yaml  # here, not at the top: a run on a preset never needs it (the module's docstring)

    try:
        text = read_text(path, _MAX_NODE_FILE_BYTES, symlinks="any")
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the simulated node file {path}: {exc}") from exc


def parse_node(doc: Any, source: str) -> NodeSpec:
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: a node file must be a mapping with a 'gpus' list")
    _reject_unknown(doc, _NODE_KEYS, source, "")
    name = str(doc.get("name", Path(source).stem))
    gpus_doc = doc.get("gpus")
    if not isinstance(gpus_doc, list):
        raise ConfigError(f"{source}: gpus must be a list, got {gpus_doc!r}")
    node_fabric = _fabric(doc.get("fabric"), source, "fabric")
    gpus = tuple(_parse_gpu(name, i, g, source, node_fabric) for i, g in enumerate(gpus_doc))
    _check_unique([g.uuid for g in gpus], source, "uuid")
    _check_unique([g.pci_bus_id.lower() for g in gpus], source, "pci_bus_id")
    _check_unique([str(g.minor) for g in gpus], source, "minor")
    for gpu in gpus:
        if gpu.pci_bus_id.lower().startswith(NVSWITCH_PCI_DOMAIN + ":"):
            raise ConfigError(
                f"{source}: gpus[{gpu.index}].pci_bus_id uses domain {NVSWITCH_PCI_DOMAIN}, "
                "kept for NVSwitches"
            )
    nvlinks = []
    for i, link in enumerate(doc.get("nvlinks") or []):
        ok = isinstance(link, list) and len(link) == 3 and all(isinstance(x, int) for x in link)
        if not ok or not (0 <= link[0] < len(gpus) and 0 <= link[1] < len(gpus)) or link[0] == link[1]:
            raise ConfigError(
                f"{source}: nvlinks[{i}] must be [gpu_a, gpu_b, lanes] of two GPUs, got {link!r}"
            )
        nvlinks.append((link[0], link[1], link[2]))
    return NodeSpec(
        name=name,
        driver_version=str(doc.get("driver_version", "550.54.15")),
        cuda_driver_version=_int(doc.get("cuda_driver_version", 12040), source, "cuda_driver_version"),
        gpus=gpus,
        nvswitch_links=_int(doc.get("nvswitch_links", 0), source, "nvswitch_links"),
        nvlinks=tuple(nvlinks),
        unprivileged_container=bool(doc.get("unprivileged_container", False)),
        hangs=_parse_hangs(doc.get("hangs") or [], len(gpus), source),
        wsl=bool(doc.get("wsl", False)),
    )


def _parse_hangs(doc: Any, gpu_count: int, source: str) -> tuple[HangSpec, ...]:
    if not isinstance(doc, list):
        raise ConfigError(f"{source}: hangs must be a list of {{call, gpu, seconds}}, got {doc!r}")
    hangs = []
    for i, item in enumerate(doc):
        where = f"{source}: hangs[{i}]"
        if not isinstance(item, dict) or not str(item.get("call", "")).startswith("nvml"):
            raise ConfigError(f"{where} must name a pynvml call, e.g. {{call: nvmlDeviceGetMemoryInfo}}")
        _reject_unknown(item, {"call", "gpu", "seconds"}, source, f"hangs[{i}].")
        gpu, seconds = item.get("gpu"), item.get("seconds")
        if gpu is not None and not (
            isinstance(gpu, int) and not isinstance(gpu, bool) and 0 <= gpu < gpu_count
        ):
            raise ConfigError(f"{where}.gpu must be the index of one of the {gpu_count} GPUs, got {gpu!r}")
        ok = seconds is None or (
            isinstance(seconds, int | float) and not isinstance(seconds, bool) and seconds > 0
        )
        if not ok:
            raise ConfigError(f"{where}.seconds must be a positive number, got {seconds!r}")
        hangs.append(HangSpec(str(item["call"]), gpu, None if seconds is None else float(seconds)))
    return tuple(hangs)


def _parse_gpu(node: str, index: int, doc: Any, source: str, node_fabric: FabricSpec | None) -> GpuSpec:
    where = f"gpus[{index}]"
    if not isinstance(doc, dict):
        raise ConfigError(f"{source}: {where} must be a mapping, got {doc!r}")
    _reject_unknown(doc, _GPU_KEYS, source, where + ".")
    if "name" not in doc or "memory_mib" not in doc:
        raise ConfigError(f"{source}: {where} needs at least 'name' and 'memory_mib'")
    memory_mib = _int(doc["memory_mib"], source, f"{where}.memory_mib")
    bus_id = str(doc.get("pci_bus_id", f"00000000:{index + 1:02X}:00.0"))
    if not _BUS_ID.match(bus_id):
        raise ConfigError(f"{source}: {where}.pci_bus_id must look like 00000000:07:00.0, got {bus_id!r}")
    gpu_uuid = str(doc.get("uuid") or f"GPU-{name_uuid(_UUID_NAMESPACE, f'{node}/{index}')}")
    mig_doc = doc.get("mig")
    mig_capable = bool(doc.get("mig_capable", _MIG_CAPABLE.search(str(doc["name"])) is not None))
    profiles = mig_doc or []
    if not isinstance(profiles, list):
        raise ConfigError(f"{source}: {where}.mig must be a list of MIG profiles, got {mig_doc!r}")
    if profiles and not mig_capable:
        raise ConfigError(f"{source}: {where} has MIG devices but mig_capable is false")
    total_gb = -(-memory_mib // 1024)
    migs = tuple(
        _parse_mig(gpu_uuid, j, p, total_gb, source, f"{where}.mig[{j}]")
        for j, p in enumerate(profiles)
        if p is not None  # a gap in the MIG index space
    )
    check_layout(
        str(doc["name"]),
        total_gb,
        [(m.profile, m.gpu_slices, m.memory_gb) for m in migs],
        f"{source}: {where}.mig",
    )
    return GpuSpec(
        index=index,
        name=str(doc["name"]),
        uuid=gpu_uuid,
        memory_mib=memory_mib,
        pci_bus_id=bus_id,
        numa_node=_int(doc.get("numa_node", -1), source, f"{where}.numa_node"),
        pcie_switch=None if doc.get("pcie_switch") is None else _int(doc["pcie_switch"], source, where),
        mig_capable=mig_capable,
        mig_enabled=mig_doc is not None,
        mig=migs,
        events=bool(doc.get("events", True)),
        minor=_int(doc.get("minor", index), source, f"{where}.minor"),
        compute_capability=_compute_capability(doc, source, where),
        pci_class=_pci_class(doc, source, where),
        # A GPU's own `fabric` (null: NOT_SUPPORTED) overrides the node's.
        fabric=_fabric(doc["fabric"], source, f"{where}.fabric") if "fabric" in doc else node_fabric,
        vgpu=_vgpu(doc.get("vgpu"), source, f"{where}.vgpu"),
    )


def _compute_capability(doc: dict[str, Any], source: str, where: str) -> tuple[int, int] | None:
    """`compute_capability: "8.0"` (null: NVML does not say), else derived from the product name."""
    if "compute_capability" not in doc:
        name = str(doc["name"])
        return next((cc for pattern, cc in _COMPUTE_CAPABILITY if pattern.search(name)), None)
    value = doc["compute_capability"]
    if value is None:
        return None
    match = re.fullmatch(r"(\d+)\.(\d+)", str(value))
    if match is None:
        raise ConfigError(f'{source}: {where}.compute_capability must look like "8.0", got {value!r}')
    return int(match[1]), int(match[2])


def _fabric(doc: Any, source: str, where: str) -> FabricSpec | None:
    """`fabric: {cluster_uuid, clique_id, state: completed, status: 0}`; null or absent: NOT_SUPPORTED."""
    if doc is None:
        return None
    if not isinstance(doc, dict) or "cluster_uuid" not in doc or "clique_id" not in doc:
        raise ConfigError(f"{source}: {where} must be a mapping with cluster_uuid and clique_id, got {doc!r}")
    _reject_unknown(doc, _FABRIC_KEYS, source, where + ".")
    import uuid  # here, not at the top: only a node on an NVLink fabric names one (uuid loads platform)

    try:
        cluster = uuid.UUID(str(doc["cluster_uuid"])).bytes
    except ValueError:
        raise ConfigError(
            f"{source}: {where}.cluster_uuid must be a UUID, got {doc['cluster_uuid']!r}"
        ) from None
    state = str(doc.get("state", "completed"))
    if state not in FABRIC_STATES:
        raise ConfigError(f"{source}: {where}.state must be one of {', '.join(FABRIC_STATES)}, got {state!r}")
    return FabricSpec(
        cluster_uuid=cluster,
        clique_id=_int(doc["clique_id"], source, f"{where}.clique_id"),
        state=FABRIC_STATES[state],
        status=_int(doc.get("status", 0), source, f"{where}.status"),
    )


def _vgpu(doc: Any, source: str, where: str) -> tuple[str, str] | None:
    """`vgpu: {host_driver_version: "550.54.16", host_driver_branch: r550_40}` on a vGPU guest's GPU."""
    if doc is None:
        return None
    keys = {"host_driver_version", "host_driver_branch"}
    if not isinstance(doc, dict) or set(doc) != keys:
        raise ConfigError(f"{source}: {where} must be a mapping of {' and '.join(sorted(keys))}, got {doc!r}")
    return str(doc["host_driver_version"]), str(doc["host_driver_branch"])


def _pci_class(doc: dict[str, Any], source: str, where: str) -> str:
    value = str(doc.get("pci_class", PCI_CLASS_3D)).lower()
    if value not in _PCI_CLASSES:
        raise ConfigError(
            f"{source}: {where}.pci_class must be one of {', '.join(_PCI_CLASSES)}, got {value!r}"
        )
    return value


def _parse_mig(gpu_uuid: str, j: int, profile: Any, total_gb: int, source: str, where: str) -> MigSpec:
    match = _PROFILE.match(str(profile))
    if not match:
        raise ConfigError(f"{source}: {where} must be a MIG profile like 1g.10gb, got {profile!r}")
    g = int(match["g"])
    gb = int(match["gb"])
    if gb > total_gb or g > 8:
        raise ConfigError(f"{source}: {where} profile {profile} does not fit a {total_gb} GB GPU")
    return MigSpec(
        profile=str(profile),
        uuid=f"MIG-{name_uuid(_UUID_NAMESPACE, f'{gpu_uuid}/{j}')}",
        gpu_slices=g,
        compute_slices=int(match["c"] or g),
        memory_gb=gb,
        slot=j,
        suffix=match["attr"] or "",
    )


def _reject_unknown(doc: dict[str, Any], known: set[str], source: str, prefix: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ConfigError(
            f"{source}: unknown node field {prefix}{unknown[0]} (known: {', '.join(sorted(known))})"
        )


def _int(value: Any, source: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: {where} must be an integer, got {value!r}")
    return value


def _check_unique(values: list[str], source: str, what: str) -> None:
    seen: set[str] = set()
    for v in values:
        if v in seen:
            raise ConfigError(f"{source}: two GPUs share {what} {v}")
        seen.add(v)
