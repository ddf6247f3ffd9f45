"""The graphics, video and ray-tracing files of the driver that do not carry its version (NVIDIA's mounts).

Beside the libraries versioned with the driver (libGLX_nvidia, libEGL_nvidia, vdpau/libvdpau_nvidia, ...:
scan.py finds those), a GLX, EGL, Vulkan, Xorg or OptiX workload needs, as NVIDIA's toolkit mounts them:

* the EGL external-platform libraries libnvidia-egl-gbm.so.X.Y.Z and libnvidia-egl-wayland.so.X.Y.Z
  (versioned on their own) in the driver's library directories;
* the Xorg modules nvidia_drv.so and libglxserver_nvidia.so.<version>, the first found under the library
  directory's nvidia/xorg or xorg/modules, then the distributions' Xorg module directories;
* GLVND's and EGL's vendor files, nvoptix.bin and the Xorg config snippets, the first found under /etc,
  /usr/local/share or /usr/share of the driver root;
* the Vulkan ICD and layer files, found the same way (or at the root itself, as GKE puts them), mounted at
  /etc/vulkan/... in the container whatever their host directory, with NVIDIA's plain bind options.

A file that is missing is left out, as NVIDIA leaves it out (a compute-only node has none of them).
"""

from __future__ import annotations

import os
import platform
import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.cdi.links import graphics_library_links
from nvidia_device_plugin.cdi.model import CONTAINER_PATH_MOUNT_OPTIONS, Mount

_EGL_PLATFORM_LIBRARIES = re.compile(r"^libnvidia-egl-(gbm|wayland)\.so\.[^/]*\.[^/]*$")
_XORG_MODULE_DIRS = (
    "modules/drivers",
    "modules/extensions",
    "modules/updates/drivers",
    "modules/updates/extensions",
)
_XORG_ROOTS = ("/usr/lib/xorg", "/usr/lib64/xorg", "/usr/X11R6/lib", "/usr/X11R6/lib64")
CONFIG_SEARCH_DIRS = ("/etc", "/usr/local/share", "/usr/share")  # /etc, then XDG_DATA_DIRS' default
CONFIG_FILES = (
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
)
VULKAN_FILES = (
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
)
# Some RPM packages name the ICD file after the architecture.
_VULKAN_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}


@dataclass(frozen=True)
class GraphicsFiles:
    mounts: tuple[Mount, ...] = ()
    links: tuple[str, ...] = ()  # the graphics create-symlinks hook's links


def scan_graphics(
    root: Path, library_dirs: Sequence[str], driver_libraries: Sequence[str], version: str
) -> GraphicsFiles:
    """The graphics files under the driver `root` (`library_dirs` hold the driver's libraries)."""
    libraries = [
        posixpath.join(d, name)
        for d in library_dirs
        for name in sorted(_names(root, d))
        if _EGL_PLATFORM_LIBRARIES.match(name) and _is_library_file(root, posixpath.join(d, name))
    ]
    cuda_dir = next((posixpath.dirname(p) for p in driver_libraries if "/libcuda.so." in p), None)
    xorg = [
        found
        for name in ("nvidia_drv.so", f"libglxserver_nvidia.so.{version}")
        if (found := _first(root, _xorg_dirs(cuda_dir), name)) is not None
    ]
    configs = [f for name in CONFIG_FILES if (f := _first(root, CONFIG_SEARCH_DIRS, name)) is not None]
    mounts = [Mount(path, path) for path in [*libraries, *xorg, *configs]]
    mounts += _vulkan_mounts(root)
    links = graphics_library_links([*driver_libraries, *xorg], version)
    return GraphicsFiles(tuple(mounts), links)


def _vulkan_mounts(root: Path) -> list[Mount]:
    names = list(VULKAN_FILES)
    arch = _VULKAN_ARCH.get(platform.machine())
    if arch is not None:
        names.append(f"vulkan/icd.d/nvidia_icd.{arch}.json")
    mounts = []
    seen: set[str] = set()
    for name in names:
        found = _first(root, (*CONFIG_SEARCH_DIRS, "/"), name)
        if found is not None and found not in seen:
            seen.add(found)
            mounts.append(Mount(found, posixpath.join("/etc", name), CONTAINER_PATH_MOUNT_OPTIONS))
    return mounts


def _xorg_dirs(cuda_dir: str | None) -> list[str]:
    dirs = []
    if cuda_dir is not None:
        dirs.append(posixpath.join(cuda_dir, "nvidia/xorg"))
        dirs += [posixpath.join(cuda_dir, "xorg", d) for d in _XORG_MODULE_DIRS]
    return dirs + [posixpath.join(r, d) for r in _XORG_ROOTS for d in _XORG_MODULE_DIRS]


def _first(root: Path, directories: Sequence[str], name: str) -> str | None:
    """The container path of the first regular file `name` in `directories` under `root`."""
    for directory in directories:
        path = posixpath.join(directory, name)
        if _is_file(root, path):
            return path
    return None


def _is_file(root: Path, path: str) -> bool:
    try:
        return (root / path.lstrip("/")).is_file()
    except OSError:
        return False


def _is_library_file(root: Path, path: str) -> bool:
    """A regular file that is not a link (a link to a library is mounted as the file it names)."""
    host = root / path.lstrip("/")
    try:
        return host.is_file() and not host.is_symlink()
    except OSError:
        return False


def _names(root: Path, directory: str) -> list[str]:
    try:
        return os.listdir(root / directory.lstrip("/"))
    except OSError:
        return []
