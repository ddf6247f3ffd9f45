"""The library symlinks a spec's create-symlinks hooks make in the container, by NVIDIA's toolkit's rules.

Links are "<target>::<link path>" strings, as the hook takes them. For each driver library mounted
(`<name>.so.<driver version>`, in mount order; a link already listed is not repeated):

* three fixed links NVIDIA adds whatever the host has: libcuda.so -> libcuda.so.1 (programs dlopen
  "libcuda.so"), libGLX_indirect.so.0 -> libGLX_nvidia.so.<version> (GLVND's indirect GLX), and
  libnvidia-opticalflow.so -> libnvidia-opticalflow.so.1;
* the SONAME link (libnvidia-ml.so.1 -> libnvidia-ml.so.<version>), when the library's ELF SONAME differs
  from its file name and the host has a symlink of that name beside the library;
* the `.so` link to the SONAME (libnvidia-ml.so -> libnvidia-ml.so.1), when the host has a symlink of
  that name beside the library.

So the links follow the host's own layout (what ldconfig and the installer made), not a fixed list. The
graphics libraries get NVIDIA's three links of their own: gbm/nvidia-drm_gbm.so -> ../libnvidia-
allocator.so.1, libnvidia-vulkan-producer.so and libglxserver_nvidia.so to their versioned files.
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable, Sequence
from pathlib import Path

from nvidia_device_plugin.cdi.elf import ElfError, read_soname

log = logging.getLogger(__name__)


def driver_library_links(root: Path, libraries: Sequence[str], version: str) -> tuple[str, ...]:
    """The create-symlinks links of the driver libraries `libraries` (container paths under `root`)."""
    links: list[str] = []
    for library in libraries:
        directory, name = posixpath.split(library)
        links += _fixed_links(directory, name, version)
        if name.endswith(f".{version}"):
            links += _soname_links(root / library.lstrip("/"), directory, name)
    return tuple(dict.fromkeys(links))


def graphics_library_links(libraries: Iterable[str], version: str) -> tuple[str, ...]:
    """The graphics create-symlinks links of the libraries found for graphics (container paths)."""
    links = []
    for library in libraries:
        directory, name = posixpath.split(library)
        if name == f"libnvidia-allocator.so.{version}":
            links.append(f"../libnvidia-allocator.so.1::{directory}/gbm/nvidia-drm_gbm.so")
        elif name in (f"libnvidia-vulkan-producer.so.{version}", f"libglxserver_nvidia.so.{version}"):
            links.append(f"{name}::{directory}/{name.removesuffix('.' + version)}")
    return tuple(dict.fromkeys(links))


def _fixed_links(directory: str, name: str, version: str) -> list[str]:
    if name == f"libcuda.so.{version}":
        return [f"libcuda.so.1::{directory}/libcuda.so"]
    if name == f"libGLX_nvidia.so.{version}":
        return [f"{name}::{directory}/libGLX_indirect.so.0"]
    if name == f"libnvidia-opticalflow.so.{version}":
        return [f"libnvidia-opticalflow.so.1::{directory}/libnvidia-opticalflow.so"]
    return []


def _soname_links(host_path: Path, directory: str, name: str) -> list[str]:
    try:
        soname = read_soname(host_path)
    except ElfError as exc:  # NVIDIA warns and makes no SONAME links for it
        log.debug("no SONAME links for %s: %s", host_path, exc)
        return []
    links = []
    if soname is not None and soname != name and _is_symlink(host_path.parent / soname):
        links.append(f"{name}::{directory}/{soname}")
    target = soname or name
    dot_so = dot_so_name(target)
    if dot_so and dot_so != target and _is_symlink(host_path.parent / dot_so):
        links.append(f"{target}::{directory}/{dot_so}")
    return links


def dot_so_name(name: str) -> str:
    """ "libcuda.so" of "libcuda.so.1" (strip extensions up to ".so"); "" when the name has no ".so"."""
    while True:
        stem, ext = posixpath.splitext(name)
        if not ext:
            return ""
        if ext == ".so":
            return name
        name = stem


def _is_symlink(path: Path) -> bool:
    try:
        return path.is_symlink()
    except OSError:
        return False
