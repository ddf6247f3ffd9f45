"""The container edits of the `gpu` spec: device nodes, the driver's mounts and NVIDIA's hooks (pure).

Mounts are NVIDIA's: host path under `nvidiaDriverRoot`, options `ro,nosuid,nodev,rbind,rprivate` for
the driver's files and `ro,nosuid,nodev,bind` for the Vulkan files it mounts under /etc. Device nodes get
their host path under `nvidiaDevRoot`. The hooks, in NVIDIA's order, each `createContainer`, run through
`nvidiaCTKPath` (`nvidia-ctk hook <name>` when the file is nvidia-ctk, else `<file> <name>`, the
standalone nvidia-cdi-hook) with NVIDIA's `NVIDIA_CTK_DEBUG=false`:

1. create-symlinks for the graphics libraries (links.py), when there are any;
2. create-symlinks for the driver libraries' SONAME and `.so` links and NVIDIA's fixed ones (links.py);
3. enable-cuda-compat --host-driver-version=<version> (CUDA forward compatibility libraries in an image
   are used only with an older host driver);
4. update-ldcache --folder <each driver library directory>;
5. disable-device-node-modification (so NVML and nvidia-smi in the container do not create nodes);
6. update-application-profile (no arguments: it writes a driver application profile limiting EGL and
   Vulkan to the container's own /dev/nvidia<N>, which a multi-GPU node otherwise shows them all of);

and the env `NVIDIA_CTK_LIBCUDA_DIR=<the directory of libcuda.so>` (NVIDIA's driver discoverer sets it, so
an image can put the host's libcuda before a forward-compatibility one) before `NVIDIA_VISIBLE_DEVICES=void`;
and, per GPU with DRM nodes, create-symlinks for its /dev/dri/by-path links. `cdiDisableHooks` names the
hooks to leave out, or `all`.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from typing import Any

from nvidia_device_plugin.cdi.model import CdiSettings, Mount
from nvidia_device_plugin.cdi.scan import NodeScan
from nvidia_device_plugin.devnodes import under

CREATE_SYMLINKS = "create-symlinks"
ENABLE_CUDA_COMPAT = "enable-cuda-compat"
UPDATE_LDCACHE = "update-ldcache"
DISABLE_DEVICE_NODE_MODIFICATION = "disable-device-node-modification"
UPDATE_APPLICATION_PROFILE = "update-application-profile"
# Hooks these specs can carry; cdiDisableHooks names them (or "all"). NVIDIA's toolkit knows a few more,
# which these specs never carry, so disabling them is accepted and changes nothing.
GENERATED_HOOKS = (
    CREATE_SYMLINKS,
    ENABLE_CUDA_COMPAT,
    UPDATE_LDCACHE,
    DISABLE_DEVICE_NODE_MODIFICATION,
    UPDATE_APPLICATION_PROFILE,
)
OTHER_KNOWN_HOOKS = ("chmod",)
HOOK_ENV = ("NVIDIA_CTK_DEBUG=false",)
# cdiFeatureFlags with an effect here; others are accepted with a note.
FEATURE_PERSISTENCED_SOCKET = "include-persistenced-socket"
# Tells the legacy nvidia-container-runtime hook not to inject devices a second time.
VISIBLE_DEVICES_VOID = "NVIDIA_VISIBLE_DEVICES=void"
LIBCUDA_DIR_ENV = "NVIDIA_CTK_LIBCUDA_DIR"


def settings_notes(settings: CdiSettings) -> tuple[str, ...]:
    notes = []
    known = {"all", *GENERATED_HOOKS, *OTHER_KNOWN_HOOKS}
    for hook in settings.disabled_hooks:
        if hook not in known:
            notes.append(
                f"cdiDisableHooks: unknown hook {hook!r} ignored (known: {', '.join(sorted(known))})"
            )
    for flag in settings.feature_flags:
        if flag != FEATURE_PERSISTENCED_SOCKET:
            notes.append(
                f"cdiFeatureFlags: {flag!r} has no effect on this plugin's specs (supported: "
                f"{FEATURE_PERSISTENCED_SOCKET})"
            )
    return tuple(notes)


def node_edit(path: str, settings: CdiSettings) -> dict[str, Any]:
    return {"path": path, "hostPath": under(settings.nvidia_dev_root, path)}


def device_edits(nodes: Sequence[str], links: Sequence[str], settings: CdiSettings) -> dict[str, Any]:
    """One device's edits: its nodes, and the hook recreating its /dev/dri/by-path links."""
    edits: dict[str, Any] = {"deviceNodes": [node_edit(p, settings) for p in nodes]}
    hooks = [h for h in [hook(settings, CREATE_SYMLINKS, *_links(links))] if h is not None]
    if hooks:
        edits["hooks"] = hooks
    return edits


def common_edits(settings: CdiSettings, scan: NodeScan) -> dict[str, Any]:
    driver = scan.driver
    mounts = [Mount(path, path) for path in driver.libraries]
    mounts += driver.graphics.mounts
    if FEATURE_PERSISTENCED_SOCKET in settings.feature_flags and driver.persistenced_socket:
        mounts.append(Mount(driver.persistenced_socket, driver.persistenced_socket))
    mounts += [Mount(path, path) for path in [*driver.firmware, *driver.binaries]]
    edits: dict[str, Any] = {
        "env": [*_libcuda_dir_env(driver.libraries), VISIBLE_DEVICES_VOID],
        "deviceNodes": [node_edit(p, settings) for p in scan.control_nodes],
        "mounts": [
            {
                "hostPath": under(settings.nvidia_driver_root, m.path),
                "containerPath": m.container_path,
                "options": list(m.options),
            }
            for m in dict.fromkeys(mounts)
        ],
    }
    hooks = [
        hook(settings, CREATE_SYMLINKS, *_links(driver.graphics.links)),
        hook(settings, CREATE_SYMLINKS, *_links(driver.links)),
        hook(settings, ENABLE_CUDA_COMPAT, f"--host-driver-version={driver.version}"),
        hook(settings, UPDATE_LDCACHE, *(a for d in driver.library_dirs for a in ("--folder", d))),
        hook(settings, DISABLE_DEVICE_NODE_MODIFICATION),
        hook(settings, UPDATE_APPLICATION_PROFILE),
    ]
    present = [h for h in hooks if h is not None]
    if present:
        edits["hooks"] = present
    return edits


def _libcuda_dir_env(libraries: Sequence[str]) -> list[str]:
    """NVIDIA_CTK_LIBCUDA_DIR=<directory of libcuda.so.<version>>, as the container sees it."""
    found = [posixpath.dirname(p) for p in libraries if posixpath.basename(p).startswith("libcuda.so.")]
    return [f"{LIBCUDA_DIR_ENV}={found[0]}"] if found else []


def _links(links: Sequence[str]) -> list[str]:
    return [arg for link in links for arg in ("--link", link)]


def hook(settings: CdiSettings, name: str, *args: str) -> dict[str, Any] | None:
    """The hook `name`, or None when cdiDisableHooks leaves it out or it would have nothing to do."""
    disabled = set(settings.disabled_hooks)
    if "all" in disabled or name in disabled or (name == CREATE_SYMLINKS and not args):
        return None
    if name == UPDATE_LDCACHE and not args:
        return None
    program = posixpath.basename(settings.hook_path)
    # nvidia-ctk runs hooks as `nvidia-ctk hook <name>`; the standalone nvidia-cdi-hook as `<name>`.
    prefix = [program, "hook"] if program == "nvidia-ctk" else [program]
    return {
        "hookName": "createContainer",
        "path": settings.hook_path,
        "args": [*prefix, name, *args],
        "env": list(HOOK_ENV),
    }
