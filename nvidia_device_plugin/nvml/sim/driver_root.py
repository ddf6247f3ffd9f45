"""The fake driver root of a simulated node, laid out as the driver (550, Ubuntu 22.04, x86_64) lays it out.

CDI spec generation (cdi/) scans it as it scans a real driver root, so it holds what a real one holds:

* the driver's libraries `<stem>.so.<driver version>`, each a minimal ELF shared object whose dynamic
  section names its SONAME (libcuda.so.550.54.15 says libcuda.so.1), with the SONAME links ldconfig made
  and the few `.so` development links the installer made, in the library directory and its vdpau/;
* the graphics files that do not carry the driver version: the EGL external-platform libraries
  (libnvidia-egl-gbm.so.1.1.1, libnvidia-egl-wayland.so.1.1.13), the gbm/nvidia-drm_gbm.so link, the Xorg
  modules under nvidia/xorg/, the GLVND / EGL / Vulkan JSON files, Xorg config snippets and nvoptix.bin;
* its binaries and GSP firmware; and files that are not the driver's (libc, GLVND's own libraries) that a
  scan must leave out.
"""

from __future__ import annotations

import struct

from nvidia_device_plugin.nvml.sim.tree import FileTree

LIBRARY_DIR = "usr/lib/x86_64-linux-gnu"

# The driver's libraries: stem -> SONAME, with "{v}" standing for the driver version (a SONAME that is the
# file's own name gets no link). "vdpau/" libraries live in the vdpau subdirectory.
DRIVER_LIBRARIES = {
    "libEGL_nvidia": "libEGL_nvidia.so.0",
    "libGLESv1_CM_nvidia": "libGLESv1_CM_nvidia.so.1",
    "libGLESv2_nvidia": "libGLESv2_nvidia.so.2",
    "libGLX_nvidia": "libGLX_nvidia.so.0",
    "libcuda": "libcuda.so.1",
    "libcudadebugger": "libcudadebugger.so.1",
    "libnvcuvid": "libnvcuvid.so.1",
    "libnvidia-allocator": "libnvidia-allocator.so.1",
    "libnvidia-cfg": "libnvidia-cfg.so.1",
    "libnvidia-eglcore": "libnvidia-eglcore.so.{v}",
    "libnvidia-encode": "libnvidia-encode.so.1",
    "libnvidia-fbc": "libnvidia-fbc.so.1",
    "libnvidia-glcore": "libnvidia-glcore.so.{v}",
    "libnvidia-glsi": "libnvidia-glsi.so.{v}",
    "libnvidia-glvkspirv": "libnvidia-glvkspirv.so.{v}",
    "libnvidia-gpucomp": "libnvidia-gpucomp.so.{v}",
    "libnvidia-ml": "libnvidia-ml.so.1",
    "libnvidia-ngx": "libnvidia-ngx.so.1",
    "libnvidia-nvvm": "libnvidia-nvvm.so.4",
    "libnvidia-opencl": "libnvidia-opencl.so.1",
    "libnvidia-opticalflow": "libnvidia-opticalflow.so.1",
    "libnvidia-ptxjitcompiler": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-rtcore": "libnvidia-rtcore.so.{v}",
    "libnvidia-tls": "libnvidia-tls.so.{v}",
    "libnvoptix": "libnvoptix.so.1",
    "vdpau/libvdpau_nvidia": "libvdpau_nvidia.so.1",
}
# `.so` development links the installer made (each points at the SONAME link).
DEV_LINKS = ("libcuda.so", "libnvidia-encode.so", "libnvidia-ml.so")
# Graphics libraries versioned on their own: file name -> SONAME (a link to the file exists).
EGL_PLATFORM_LIBRARIES = {
    "libnvidia-egl-gbm.so.1.1.1": "libnvidia-egl-gbm.so.1",
    "libnvidia-egl-wayland.so.1.1.13": "libnvidia-egl-wayland.so.1",
}
XORG_DIR = f"{LIBRARY_DIR}/nvidia/xorg"
GRAPHICS_CONFIGS = (
    "usr/share/glvnd/egl_vendor.d/10_nvidia.json",
    "usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
    "usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
    "usr/share/nvidia/nvoptix.bin",
    "usr/share/X11/xorg.conf.d/10-nvidia.conf",
    "usr/share/vulkan/icd.d/nvidia_icd.json",
    "usr/share/vulkan/implicit_layer.d/nvidia_layers.json",
)
DRIVER_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
DRIVER_FIRMWARE = ("gsp_ga10x.bin", "gsp_tu10x.bin")
# Not the driver's: the C library and GLVND's dispatch libraries (their SONAME links too).
NOT_DRIVER_LIBRARIES = {
    "libc.so.6": "libc.so.6",
    "libGLX.so.0.0.0": "libGLX.so.0",
    "libEGL.so.1.1.0": "libEGL.so.1",
}


def driver_library_name(stem: str, version: str) -> str:
    return f"{stem}.so.{version}"


# A WSL2 guest's driver files (the Windows driver's): the NVIDIA adapter's driver store package under
# /usr/lib/wsl/drivers/ (libraries, nvcubins.bin, nvidia-smi) and /usr/lib/wsl/lib (libdxcore.so and the
# loader copies). No libcuda.so.<driver version> and nothing under /usr/lib/x86_64-linux-gnu.
WSL_LIBRARY_DIR = "usr/lib/wsl/lib"
WSL_DRIVER_STORE = "usr/lib/wsl/drivers/nv_dispi.inf_amd64_0123456789abcdef"
WSL_STORE_LIBRARIES = {
    "libcuda.so.1.1": "libcuda.so.1",
    "libcuda_loader.so": "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1": "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml.so.1": "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so": "libnvidia-ml_loader.so",
    "libnvdxgdmal.so.1": "libnvdxgdmal.so.1",
}
WSL_LIB_LIBRARIES = {
    "libcuda.so.1.1": "libcuda.so.1",
    "libdxcore.so": "libdxcore.so",
    "libnvidia-ml.so.1": "libnvidia-ml.so.1",
}


def write_driver_root(root: FileTree, version: str, wsl: bool = False) -> None:
    """Lay out the driver root of driver `version` in `root`; on a WSL2 guest (`wsl`), the WSL2 layout
    instead."""
    if wsl:
        _write_wsl_driver_root(root)
        return
    for stem, soname in DRIVER_LIBRARIES.items():
        _shared_object(root, f"{LIBRARY_DIR}/{driver_library_name(stem, version)}", soname.format(v=version))
    for link in DEV_LINKS:
        root.link(f"{LIBRARY_DIR}/{link}", DRIVER_LIBRARIES[link.removesuffix(".so")])
    for name, soname in {**EGL_PLATFORM_LIBRARIES, **NOT_DRIVER_LIBRARIES}.items():
        _shared_object(root, f"{LIBRARY_DIR}/{name}", soname)
    root.link(f"{LIBRARY_DIR}/gbm/nvidia-drm_gbm.so", "../libnvidia-allocator.so.1")
    _shared_object(root, f"{XORG_DIR}/nvidia_drv.so", "nvidia_drv.so")
    glx_server = f"libglxserver_nvidia.so.{version}"
    _shared_object(root, f"{XORG_DIR}/{glx_server}", glx_server)
    root.link(f"{XORG_DIR}/libglxserver_nvidia.so", glx_server)
    for config in GRAPHICS_CONFIGS:
        root.file(config, "{}\n")
    for name in DRIVER_BINARIES:
        root.file(f"usr/bin/{name}", b"\x7fELF")
    for name in DRIVER_FIRMWARE:
        root.file(f"lib/firmware/nvidia/{version}/{name}", b"\0")


def _shared_object(root: FileTree, path: str, soname: str) -> None:
    """`path` as a minimal ELF64 shared object naming `soname`, and the SONAME link ldconfig makes."""
    root.file(path, elf_shared_object(soname))
    directory, _, name = path.rpartition("/")
    if soname != name:
        root.link(f"{directory}/{soname}", name)


def elf_shared_object(soname: str) -> bytes:
    """An ELF64 little-endian x86_64 ET_DYN file with a .dynstr, a .dynamic holding DT_SONAME, a .shstrtab.

    Only what a reader of the SONAME needs (section headers, as Go's debug/elf reads them); nothing runs it.
    """
    dynstr = b"\0" + soname.encode() + b"\0"
    dynamic = struct.pack("<qQqQ", 14, 1, 0, 0)  # DT_SONAME -> dynstr offset 1; DT_NULL
    shstrtab = b"\0.dynstr\0.dynamic\0.shstrtab\0"
    header_size, section_header_size = 64, 64
    dynstr_at = header_size
    dynamic_at = dynstr_at + len(dynstr)
    shstrtab_at = dynamic_at + len(dynamic)
    sections_at = shstrtab_at + len(shstrtab)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)  # ELFCLASS64, ELFDATA2LSB, EV_CURRENT
    header = ident + struct.pack(
        "<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, sections_at, 0, header_size, 56, 0, section_header_size, 4, 3
    )
    sections = [
        bytes(section_header_size),
        struct.pack("<IIQQQQIIQQ", 1, 3, 2, 0, dynstr_at, len(dynstr), 0, 0, 1, 0),  # .dynstr STRTAB
        struct.pack("<IIQQQQIIQQ", 9, 6, 3, 0, dynamic_at, len(dynamic), 1, 0, 8, 16),  # .dynamic -> 1
        struct.pack("<IIQQQQIIQQ", 18, 3, 0, 0, shstrtab_at, len(shstrtab), 0, 0, 1, 0),  # .shstrtab
    ]
    return header + dynstr + dynamic + shstrtab + b"".join(sections)


def _write_wsl_driver_root(root: FileTree) -> None:
    for directory, libraries in (
        (WSL_DRIVER_STORE, WSL_STORE_LIBRARIES),
        (WSL_LIBRARY_DIR, WSL_LIB_LIBRARIES),
    ):
        for name, soname in libraries.items():
            _shared_object(root, f"{directory}/{name}", soname)
        root.file(f"{directory}/nvidia-smi", b"\x7fELF")
    root.file(f"{WSL_DRIVER_STORE}/nvcubins.bin", b"\0")
