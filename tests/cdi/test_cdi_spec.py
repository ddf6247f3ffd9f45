"""The `gpu` CDI spec on simulated nodes (their fake driver root, /dev and sysfs), against NVIDIA's.

The expected values are NVIDIA's observed ones: the spec its v0.20 plugin writes and `nvidia-ctk cdi
generate` on the same driver root (NVIDIA/nvidia-container-toolkit pkg/nvcdi, internal/discover:
driver-nvml.go, graphics.go, symlinks, hooks.go, mounts.go; internal/platform-support/dgpu;
NVIDIA/k8s-device-plugin internal/cdi). Every spec is checked against the CDI schema (cdi_support.py).
"""

from __future__ import annotations

import io
import json
import shutil
from contextlib import redirect_stdout
from dataclasses import MISSING, fields, replace

from cdi_support import assert_valid_spec, by_name, cdi_config, gpu_spec, snapshot_of

from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiSettings
from nvidia_device_plugin.cli.main import main
from nvidia_device_plugin.config.v1 import Config, Flags
from nvidia_device_plugin.health.registry import UnhealthyIds
from nvidia_device_plugin.nvml.session import NvmlSession, open_nvml
from nvidia_device_plugin.nvml.sim.driver_root import DRIVER_BINARIES, DRIVER_LIBRARIES
from nvidia_device_plugin.nvml.sim.host import drm_node_names
from nvidia_device_plugin.serving.allocate import AllocationIndex, AllocationSettings, allocate
from nvidia_device_plugin.snapshot import build_snapshot

from support.checks import assert_all

LIB = "/usr/lib/x86_64-linux-gnu"
DRIVER_OPTIONS = ["ro", "nosuid", "nodev", "rbind", "rprivate"]  # NVIDIA's discover.Mount options
VULKAN_OPTIONS = ["ro", "nosuid", "nodev", "bind"]  # NVIDIA's mountsToContainerPath (Vulkan files)


def graphics_mounts(version: str) -> dict[str, tuple[str, list[str]]]:
    """NVIDIA's graphics mounts on this driver root: container path -> (host path, options)."""
    paths = [
        f"{LIB}/libnvidia-egl-gbm.so.1.1.1",
        f"{LIB}/libnvidia-egl-wayland.so.1.1.13",
        f"{LIB}/nvidia/xorg/nvidia_drv.so",
        f"{LIB}/nvidia/xorg/libglxserver_nvidia.so.{version}",
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        "/usr/share/nvidia/nvoptix.bin",
        "/usr/share/X11/xorg.conf.d/10-nvidia.conf",
    ]
    mounts = {p: (p, DRIVER_OPTIONS) for p in paths}
    for name in ("icd.d/nvidia_icd.json", "implicit_layer.d/nvidia_layers.json"):
        mounts[f"/etc/vulkan/{name}"] = (f"/usr/share/vulkan/{name}", VULKAN_OPTIONS)
    return mounts


def test_whole_gpus_by_uuid_with_their_drm_nodes_and_no_all_device(sessions: list[NvmlSession]) -> None:
    snapshot = snapshot_of(sessions, "dgx-a100", cdi_config())
    spec = gpu_spec(snapshot)
    gpus = sorted(snapshot.inventory.gpus, key=lambda g: g.index)
    # NVIDIA: /dev/nvidia<minor>, then the card* and renderD* entries of the GPU's sysfs drm/ directory;
    # no "all" (its plugin sets no merged device). card0 is the board's VGA: no GPU's.
    assert by_name(spec) == {
        g.uuid: [f"/dev/nvidia{g.minor}", *(f"/dev/dri/{n}" for n in drm_node_names(g.minor))] for g in gpus
    }
    assert spec.file_name == "k8s.device-plugin.nvidia.com-gpu.json"
    assert spec.document["cdiVersion"] == "0.5.0"  # device nodes carry hostPath: 0.5.0, and nothing newer
    for device, gpu in zip(spec.document["devices"], gpus, strict=True):
        bus = gpu.pci_bus_id.lower()[4:]
        card, render = drm_node_names(gpu.minor)
        [hook] = device["containerEdits"]["hooks"]  # NVIDIA's by-path hook, per device
        assert hook["args"] == [
            "nvidia-ctk", "hook", "create-symlinks",
            "--link", f"../{card}::/dev/dri/by-path/pci-{bus}-card",
            "--link", f"../{render}::/dev/dri/by-path/pci-{bus}-render",
        ]  # fmt: skip
    edits = spec.document["containerEdits"]
    # NVIDIA's driver discoverer names libcuda.so's directory (NVIDIA_CTK_LIBCUDA_DIR) before void.
    assert edits["env"] == [f"NVIDIA_CTK_LIBCUDA_DIR={LIB}", "NVIDIA_VISIBLE_DEVICES=void"]
    # The simulator has no nvidia-modeset: only nodes that exist are named.
    assert [n["path"] for n in edits["deviceNodes"]] == [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]


def test_mounts_are_every_versioned_library_the_graphics_files_firmware_and_binaries(
    sessions: list[NvmlSession],
) -> None:
    snapshot = snapshot_of(sessions, "dgx-a100", cdi_config())
    version = snapshot.inventory.driver_version
    mounts = {
        m["containerPath"]: (m["hostPath"], m["options"])
        for m in gpu_spec(snapshot).document["containerEdits"]["mounts"]
    }
    # NVIDIA: every *.so.<driver version> of the library directories and vdpau/ (GLX, EGL, GLES, VDPAU
    # included), not the SONAME links, not libc or GLVND's own libraries.
    libraries = {f"{LIB}/{stem}.so.{version}" for stem in DRIVER_LIBRARIES}
    assert f"{LIB}/vdpau/libvdpau_nvidia.so.{version}" in libraries
    other = {
        *(f"/usr/bin/{name}" for name in DRIVER_BINARIES),
        f"/lib/firmware/nvidia/{version}/gsp_ga10x.bin",
        f"/lib/firmware/nvidia/{version}/gsp_tu10x.bin",
    }
    expected = {p: (p, DRIVER_OPTIONS) for p in libraries | other} | graphics_mounts(version)
    assert mounts == expected
    for stem in (
        "libGLX_nvidia",
        "libEGL_nvidia",
        "libGLESv1_CM_nvidia",
        "libGLESv2_nvidia",
        "vdpau/libvdpau_nvidia",
    ):
        assert f"{LIB}/{stem}.so.{version}" in mounts  # graphics libraries versioned with the driver


def test_hooks_are_nvidias_in_its_order_and_the_library_links_follow_its_rule(
    sessions: list[NvmlSession],
) -> None:
    snapshot = snapshot_of(sessions, "t4-single", cdi_config())
    version = snapshot.inventory.driver_version
    hooks = gpu_spec(snapshot).document["containerEdits"]["hooks"]
    assert [h["args"][2] for h in hooks] == [
        "create-symlinks",  # the graphics libraries'
        "create-symlinks",  # the driver libraries'
        "enable-cuda-compat",
        "update-ldcache",
        "disable-device-node-modification",
        "update-application-profile",  # EGL/Vulkan limited to the container's own GPUs
    ]
    assert_all(hooks, lambda h: h["hookName"] == "createContainer" and h["env"] == ["NVIDIA_CTK_DEBUG=false"])
    assert hooks[2]["args"][3:] == [f"--host-driver-version={version}"]
    assert hooks[3]["args"][3:] == ["--folder", LIB, "--folder", f"{LIB}/vdpau"]
    assert hooks[4]["args"][3:] == []
    assert hooks[5]["args"][3:] == []  # NVIDIA's: no arguments (the hook reads the container's /dev)
    links = [a for h in hooks[:2] for a in h["args"][4::2]]
    v = version
    # NVIDIA's rule on this driver root: the fixed libcuda.so / libGLX_indirect.so.0 /
    # libnvidia-opticalflow.so links, each SONAME link the host has, each .so link the host has, and the
    # graphics links (nvidia-drm_gbm.so, libglxserver_nvidia.so): 26, as on NVIDIA's reference node.
    assert links == [
        f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so",
        f"libglxserver_nvidia.so.{v}::{LIB}/nvidia/xorg/libglxserver_nvidia.so",
        f"libEGL_nvidia.so.{v}::{LIB}/libEGL_nvidia.so.0",
        f"libGLESv1_CM_nvidia.so.{v}::{LIB}/libGLESv1_CM_nvidia.so.1",
        f"libGLESv2_nvidia.so.{v}::{LIB}/libGLESv2_nvidia.so.2",
        f"libGLX_nvidia.so.{v}::{LIB}/libGLX_indirect.so.0",
        f"libGLX_nvidia.so.{v}::{LIB}/libGLX_nvidia.so.0",
        f"libcuda.so.1::{LIB}/libcuda.so",
        f"libcuda.so.{v}::{LIB}/libcuda.so.1",
        f"libcudadebugger.so.{v}::{LIB}/libcudadebugger.so.1",
        f"libnvcuvid.so.{v}::{LIB}/libnvcuvid.so.1",
        f"libnvidia-allocator.so.{v}::{LIB}/libnvidia-allocator.so.1",
        f"libnvidia-cfg.so.{v}::{LIB}/libnvidia-cfg.so.1",
        f"libnvidia-encode.so.{v}::{LIB}/libnvidia-encode.so.1",
        f"libnvidia-encode.so.1::{LIB}/libnvidia-encode.so",
        f"libnvidia-fbc.so.{v}::{LIB}/libnvidia-fbc.so.1",
        f"libnvidia-ml.so.{v}::{LIB}/libnvidia-ml.so.1",
        f"libnvidia-ml.so.1::{LIB}/libnvidia-ml.so",
        f"libnvidia-ngx.so.{v}::{LIB}/libnvidia-ngx.so.1",
        f"libnvidia-nvvm.so.{v}::{LIB}/libnvidia-nvvm.so.4",
        f"libnvidia-opencl.so.{v}::{LIB}/libnvidia-opencl.so.1",
        f"libnvidia-opticalflow.so.1::{LIB}/libnvidia-opticalflow.so",
        f"libnvidia-opticalflow.so.{v}::{LIB}/libnvidia-opticalflow.so.1",
        f"libnvidia-ptxjitcompiler.so.{v}::{LIB}/libnvidia-ptxjitcompiler.so.1",
        f"libnvoptix.so.{v}::{LIB}/libnvoptix.so.1",
        f"libvdpau_nvidia.so.{v}::{LIB}/vdpau/libvdpau_nvidia.so.1",
    ]


def test_the_links_are_derived_from_the_host_not_a_list(sessions: list[NvmlSession]) -> None:
    session = open_nvml("t4-single")
    sessions.append(session)
    assert session.host.driver_root is not None
    libs = session.host.driver_root / LIB.lstrip("/")
    version = build_snapshot(session, cdi_config()).inventory.driver_version
    (libs / "libnvidia-ml.so").unlink()  # no .so development link on this host: none in the container
    (libs / "libnvidia-cfg.so").symlink_to("libnvidia-cfg.so.1")  # one more: one more in the container
    (libs / f"libnvidia-fbc.so.{version}").write_bytes(b"not an ELF file")  # no SONAME readable
    links = [
        a
        for h in gpu_spec(build_snapshot(session, cdi_config())).document["containerEdits"]["hooks"][:2]
        for a in h["args"][4::2]
    ]
    assert f"libnvidia-ml.so.1::{LIB}/libnvidia-ml.so" not in links
    assert f"libnvidia-ml.so.{version}::{LIB}/libnvidia-ml.so.1" in links
    assert f"libnvidia-cfg.so.1::{LIB}/libnvidia-cfg.so" in links
    assert not any("libnvidia-fbc" in link for link in links)
    assert len(links) == 26 - 1 + 1 - 1


def test_without_nvidia_drm_a_gpu_has_no_drm_nodes_and_no_by_path_hook(sessions: list[NvmlSession]) -> None:
    session = open_nvml("t4-single")
    sessions.append(session)
    for drm in (session.host.sysfs_root / "bus/pci/devices").glob("*/drm"):
        shutil.rmtree(drm)  # nvidia-drm not loaded: the kernel lists no DRM devices under the GPU
    [device] = gpu_spec(build_snapshot(session, cdi_config())).document["devices"]
    assert device["containerEdits"] == {"deviceNodes": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}]}


def test_mig_devices_by_index_carry_the_same_nodes_as_pass_device_specs(sessions: list[NvmlSession]) -> None:
    snapshot = snapshot_of(sessions, "a100-mig-mixed", cdi_config(ids="index", mig="mixed"))
    spec = by_name(gpu_spec(snapshot))
    assert "3" in spec and "0:0" in spec and "all" not in spec
    specs_settings = replace(
        AllocationSettings.from_config(Config()),
        device_list_strategy=("envvar",),
        pass_device_specs=True,
        proc_root=snapshot.allocation.proc_root,
        device_node_probe_root=snapshot.allocation.device_node_probe_root,
    )
    control = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
    healthy = UnhealthyIds(frozenset())
    for plan in snapshot.plans:
        index = AllocationIndex(plan, snapshot.inventory)
        for dev in plan.devices:
            response = allocate(index, [[dev.id]], specs_settings, healthy).container_responses[0]
            passed = [d.container_path for d in response.devices if d.container_path not in control]
            # The CDI device adds the GPU's DRM nodes (NVIDIA's spec has them; passDeviceSpecs does not).
            assert [n for n in spec[dev.index_id] if not n.startswith("/dev/dri/")] == passed
            if dev.kind == "mig":
                assert len(passed) == 3 and passed[1].startswith("/dev/nvidia-caps/nvidia-cap")
                assert spec[dev.index_id] == passed  # a MIG device has no DRM nodes of its own


def test_replicas_define_each_physical_device_once(sessions: list[NvmlSession]) -> None:
    snapshot = snapshot_of(sessions, "dgx-a100", cdi_config("cdi-annotations", replicas=4))
    [plan] = snapshot.plans
    assert len(plan.devices) == 32
    assert set(by_name(gpu_spec(snapshot))) == {g.uuid for g in snapshot.inventory.gpus}


def test_host_paths_follow_the_driver_and_dev_roots_and_the_hook_path(sessions: list[NvmlSession]) -> None:
    config = cdi_config(nvidia_ctk_path="/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    config = Config(
        flags=Flags(
            nvidia_driver_root="/run/nvidia/driver", nvidia_dev_root="/host", plugin=config.flags.plugin
        )
    )
    spec = gpu_spec(snapshot_of(sessions, "t4-single", config)).document
    edits = spec["containerEdits"]
    assert {n["hostPath"] for n in edits["deviceNodes"]} == {
        "/host/dev/nvidiactl",
        "/host/dev/nvidia-uvm",
        "/host/dev/nvidia-uvm-tools",
    }
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": p, "hostPath": "/host" + p}
        for p in ("/dev/nvidia0", "/dev/dri/card1", "/dev/dri/renderD128")
    ]
    assert_all(edits["mounts"], lambda m: m["hostPath"].startswith("/run/nvidia/driver/"))
    assert {h["path"] for h in edits["hooks"]} == {"/usr/local/nvidia/toolkit/nvidia-cdi-hook"}
    assert [h["args"][:2] for h in edits["hooks"]][-2:] == [
        ["nvidia-cdi-hook", "disable-device-node-modification"],
        ["nvidia-cdi-hook", "update-application-profile"],
    ]
    # The libcuda directory is where the container sees it, not the host path under the driver root.
    assert edits["env"][0] == f"NVIDIA_CTK_LIBCUDA_DIR={LIB}"


def test_the_gpu_operator_hook_path_runs_nvidia_ctk_hook(sessions: list[NvmlSession]) -> None:
    operator = "/usr/local/nvidia/toolkit/nvidia-ctk"  # where the GPU Operator installs the toolkit
    spec = gpu_spec(snapshot_of(sessions, "t4-single", cdi_config(nvidia_ctk_path=operator))).document
    hooks = [*spec["containerEdits"]["hooks"], *spec["devices"][0]["containerEdits"]["hooks"]]
    assert {h["path"] for h in hooks} == {operator}
    assert_all(hooks, lambda h: h["args"][:2] == ["nvidia-ctk", "hook"])


def test_disabled_hooks_and_feature_flags(sessions: list[NvmlSession]) -> None:
    disabled = ("update-ldcache", "enable-cuda-compat", "disable-device-node-modification")
    one = gpu_spec(snapshot_of(sessions, "t4-single", cdi_config(cdi_disable_hooks=disabled)))
    assert [h["args"][2] for h in one.document["containerEdits"]["hooks"]] == [
        *["create-symlinks"] * 2,
        "update-application-profile",
    ]
    profile = ("update-application-profile",)
    without = gpu_spec(snapshot_of(sessions, "t4-single", cdi_config(cdi_disable_hooks=disabled + profile)))
    assert [h["args"][2] for h in without.document["containerEdits"]["hooks"]] == ["create-symlinks"] * 2
    snapshot = snapshot_of(
        sessions,
        "t4-single",
        cdi_config(cdi_disable_hooks=("all", "bogus"), cdi_feature_flags=("frobnicate",)),
    )
    spec = gpu_spec(snapshot).document
    assert "hooks" not in spec["containerEdits"] and "hooks" not in spec["devices"][0]["containerEdits"]
    assert snapshot.cdi is not None
    assert [n.split(":")[0] for n in snapshot.cdi.notes] == ["cdiDisableHooks", "cdiFeatureFlags"]
    assert "'bogus' ignored" in snapshot.cdi.notes[0] and "'frobnicate'" in snapshot.cdi.notes[1]


def test_no_spec_without_a_cdi_strategy(sessions: list[NvmlSession]) -> None:
    assert snapshot_of(sessions, "t4-single", Config()).cdi is None


def test_a_missing_driver_root_or_library_is_named(sessions: list[NvmlSession]) -> None:
    session = open_nvml("t4-single")
    sessions.append(session)
    assert session.host.driver_root is not None
    lib = session.host.driver_root / "usr/lib/x86_64-linux-gnu"
    assert session.simulator is not None
    version = session.simulator.node.driver_version
    (lib / f"libnvidia-ml.so.{version}").unlink()
    cdi = build_snapshot(session, cdi_config()).cdi
    assert cdi is not None and cdi.specs == ()
    assert (
        cdi.problem is not None
        and f"libnvidia-ml.so.{version} (driver {version}) was not found" in cdi.problem
    )
    shutil.rmtree(session.host.driver_root)
    cdi = build_snapshot(session, cdi_config()).cdi
    assert cdi is not None and cdi.problem is not None
    assert f"the driver root {session.host.driver_root} does not exist" in cdi.problem


def test_a_compute_only_driver_root_gets_no_graphics_mounts(sessions: list[NvmlSession]) -> None:
    session = open_nvml("t4-single")
    sessions.append(session)
    assert session.host.driver_root is not None
    for tree in ("usr/share", f"{LIB.lstrip('/')}/nvidia"):
        shutil.rmtree(session.host.driver_root / tree)
    edits = gpu_spec(build_snapshot(session, cdi_config())).document["containerEdits"]
    mounted = {m["containerPath"] for m in edits["mounts"]}
    assert not mounted & {"/etc/vulkan/icd.d/nvidia_icd.json", "/usr/share/nvidia/nvoptix.bin"}
    assert f"{LIB}/libnvidia-egl-gbm.so.1.1.1" in mounted  # still in the library directory
    assert edits["hooks"][0]["args"][4::2] == [f"../libnvidia-allocator.so.1::{LIB}/gbm/nvidia-drm_gbm.so"]


def _plan_output(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            main(["plan", "--simulate", "t4-single", *argv], environ={"DEVICE_LIST_STRATEGY": "cdi-cri"}) == 0
        )
    return out.getvalue()


def test_plan_shows_the_specs_as_json_as_a_summary_and_alone() -> None:
    document = json.loads(_plan_output("--output", "json"))
    [spec] = document["cdi"]["specs"]
    assert spec["file"] == "k8s.device-plugin.nvidia.com-gpu.json" and document["cdi"]["problem"] is None
    assert spec["devices"] == [f"{CDI_VENDOR}/gpu={d['id']}" for d in document["resources"][0]["devices"]]
    assert_valid_spec(spec["spec"])
    assert (
        "k8s.device-plugin.nvidia.com-gpu.json: 1 devices, 44 driver files mounted, 6 hooks" in _plan_output()
    )
    alone = json.loads(_plan_output("--cdi-spec"))
    assert alone == {spec["file"]: spec["spec"]}


def test_every_spec_of_every_preset_validates(sessions: list[NvmlSession]) -> None:
    for node, mig in (
        ("dgx-h100", "none"),
        ("a100-mig-mixed", "mixed"),
        ("h200-mig", "mixed"),
        ("b200", "none"),
    ):
        for ids in ("uuid", "index"):
            snapshot = snapshot_of(sessions, node, cdi_config("cdi-cri", ids=ids, mig=mig))  # type: ignore[arg-type]
            assert snapshot.cdi is not None and snapshot.cdi.problem is None, (node, snapshot.cdi)
            for spec in snapshot.cdi.specs:
                assert_valid_spec(spec.document)


def test_cdi_settings_take_every_default_from_the_config() -> None:
    # No default of its own to drift from the config's: from_config is the one way to build the settings.
    assert [f.name for f in fields(CdiSettings) if f.default is not MISSING] == []
    assert [f.name for f in fields(CdiSettings) if f.default_factory is not MISSING] == []
    settings = CdiSettings.from_config(Config())
    assert (settings.nvidia_driver_root, settings.container_driver_root, settings.spec_dir) == (
        "/",
        "/driver-root",
        "/var/run/cdi",
    )
