"""Pure rules: the SONAME reader, the `.so` link name, and the lowest cdiVersion a spec's features allow."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from nvidia_device_plugin.cdi.elf import ElfError, read_soname
from nvidia_device_plugin.cdi.links import dot_so_name
from nvidia_device_plugin.cdi.version import minimum_version
from nvidia_device_plugin.nvml.sim.driver_root import elf_shared_object


def _elf32_big_endian(soname: str) -> bytes:
    """An ELF32 MSB object (a PowerPC library, say) with .dynstr, .dynamic (DT_NEEDED, DT_SONAME)."""
    dynstr = b"\0libc.so.6\0" + soname.encode() + b"\0"
    dynamic = struct.pack(">iIiIiI", 1, 1, 14, 11, 0, 0)  # DT_NEEDED libc, DT_SONAME, DT_NULL
    at_dynstr, at_dynamic = 52, 52 + len(dynstr)
    at_sections = at_dynamic + len(dynamic)
    header = b"\x7fELF" + bytes([1, 2, 1]) + bytes(9)
    header += struct.pack(">HHIIIIIHHHHHH", 3, 20, 1, 0, 0, at_sections, 0, 52, 32, 0, 40, 3, 0)
    sections = bytes(40)
    sections += struct.pack(">IIIIIIIIII", 0, 3, 2, 0, at_dynstr, len(dynstr), 0, 0, 1, 0)
    sections += struct.pack(">IIIIIIIIII", 0, 6, 3, 0, at_dynamic, len(dynamic), 1, 0, 4, 8)
    return header + dynstr + dynamic + sections


def test_the_soname_is_read_from_the_dynamic_section_of_either_class_and_byte_order(tmp_path: Path) -> None:
    lib64 = tmp_path / "libcuda.so.550.54.15"
    lib64.write_bytes(elf_shared_object("libcuda.so.1"))
    assert read_soname(lib64) == "libcuda.so.1"
    lib32 = tmp_path / "libfoo.so.2.0"
    lib32.write_bytes(_elf32_big_endian("libfoo.so.2"))
    assert read_soname(lib32) == "libfoo.so.2"


def test_what_is_not_a_library_is_refused_without_reading_much_or_blocking(tmp_path: Path) -> None:
    (tmp_path / "text").write_text("not an ELF file")
    (tmp_path / "truncated").write_bytes(elf_shared_object("libx.so.1")[:100])
    huge = bytearray(elf_shared_object("libx.so.1"))
    struct.pack_into("<H", huge, 60, 0xFFFF)  # e_shnum: 65535 section headers of 64 bytes: over the bound
    (tmp_path / "huge").write_bytes(bytes(huge))
    os.mkfifo(tmp_path / "fifo")
    for name, message in (
        ("text", "not an ELF file"),
        ("truncated", "truncated"),
        ("huge", "larger than a library has"),
        ("fifo", "not a regular file"),
        ("missing", "cannot open"),
    ):
        with pytest.raises(ElfError, match=message):
            read_soname(tmp_path / name)


def test_dot_so_names() -> None:
    assert dot_so_name("libcuda.so.1") == "libcuda.so"
    assert dot_so_name("libnvidia-glcore.so.550.54.15") == "libnvidia-glcore.so"
    assert dot_so_name("libcuda.so") == "libcuda.so"
    assert dot_so_name("nvoptix.bin") == ""


def _spec(**extra: object) -> dict[str, object]:
    device: dict[str, object] = {
        "name": "gpu0",
        "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]},
    }
    return {"kind": "example.com/gpu", "devices": [device], **extra}


def test_the_cdi_version_is_the_lowest_the_features_allow() -> None:
    assert minimum_version(_spec()) == "0.3.0"
    mount = {"hostPath": "/a", "containerPath": "/a", "type": "bind"}
    assert minimum_version(_spec(containerEdits={"mounts": [mount]})) == "0.4.0"
    host_path = {"deviceNodes": [{"path": "/dev/x", "hostPath": "/host/dev/x"}]}
    assert minimum_version(_spec(containerEdits=host_path)) == "0.5.0"
    digit = _spec()
    digit["devices"] = [{"name": "0", "containerEdits": {"env": ["A=1"]}}]
    assert minimum_version(digit) == "0.5.0"
    assert minimum_version(_spec(annotations={"a": "b"})) == "0.6.0"
    assert minimum_version({**_spec(), "kind": "example.com/gpu.v2"}) == "0.6.0"
    assert minimum_version(_spec(containerEdits={"additionalGids": [5]})) == "0.7.0"
    assert (
        minimum_version(_spec(containerEdits={"netDevices": [{"hostInterfaceName": "a", "name": "b"}]}))
        == "1.1.0"
    )
