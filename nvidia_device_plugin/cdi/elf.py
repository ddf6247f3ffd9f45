"""The SONAME of a shared library, read from its ELF dynamic section (as NVIDIA's toolkit reads it).

The library symlinks a CDI spec asks the runtime to create depend on each driver library's SONAME
(libcuda.so.550.54.15 -> libcuda.so.1). Like Go's debug/elf, this reads the section headers, finds the
SHT_DYNAMIC section and the string table it links to, and looks up DT_SONAME. Every read is bounded (a
library on the node is a file the node can write): only regular files, opened without blocking, at most
a few header tables and one string. Both ELF classes and byte orders are understood.
"""

from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

_MAGIC = b"\x7fELF"
_SHT_DYNAMIC = 6
_DT_NULL = 0
_DT_SONAME = 14
_MAX_TABLE_BYTES = 1 << 20  # section headers or a dynamic section larger than this is not a library
_MAX_NAME_BYTES = 4096


class ElfError(Exception):
    """The file is not an ELF object this reader understands, or it cannot be read."""


@dataclass(frozen=True)
class _Layout:
    order: str  # "<" or ">"
    wide: bool  # ELFCLASS64

    @property
    def section_header(self) -> str:
        # sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link (then info, align, entsize)
        return self.order + ("IIQQQQI" if self.wide else "IIIIIII")

    @property
    def dyn(self) -> str:
        return self.order + ("qQ" if self.wide else "iI")


def read_soname(path: Path) -> str | None:
    """The DT_SONAME of the library at `path`; None when it names none. Raises ElfError."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ElfError(f"cannot open {path}: {exc.strerror or exc}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ElfError(f"{path} is not a regular file")
        return _soname(fd, path)
    except OSError as exc:
        raise ElfError(f"cannot read {path}: {exc.strerror or exc}") from exc
    finally:
        os.close(fd)


def _soname(fd: int, path: Path) -> str | None:
    ident = os.pread(fd, 64, 0)
    if len(ident) < 52 or ident[:4] != _MAGIC or ident[4] not in (1, 2) or ident[5] not in (1, 2):
        raise ElfError(f"{path} is not an ELF file")
    layout = _Layout("<" if ident[5] == 1 else ">", ident[4] == 2)
    if layout.wide and len(ident) < 64:
        raise ElfError(f"{path} is truncated")
    if layout.wide:
        (shoff,) = struct.unpack_from(layout.order + "Q", ident, 40)
        entsize, count = struct.unpack_from(layout.order + "HH", ident, 58)
    else:
        (shoff,) = struct.unpack_from(layout.order + "I", ident, 32)
        entsize, count = struct.unpack_from(layout.order + "HH", ident, 46)
    headers = _read(fd, shoff, entsize * count, path)
    sections = [
        struct.unpack_from(layout.section_header, headers, i * entsize)
        for i in range(count)
        if entsize >= struct.calcsize(layout.section_header)
    ]
    dynamic = next((s for s in sections if s[1] == _SHT_DYNAMIC), None)
    if dynamic is None or dynamic[6] >= len(sections):
        return None
    entries = _read(fd, dynamic[4], dynamic[5], path)
    size = struct.calcsize(layout.dyn)
    for at in range(0, len(entries) - size + 1, size):
        tag, value = struct.unpack_from(layout.dyn, entries, at)
        if tag == _DT_NULL:
            break
        if tag == _DT_SONAME:
            strings = sections[dynamic[6]]
            if value >= strings[5]:
                raise ElfError(f"{path}: DT_SONAME points outside its string table")
            raw = os.pread(fd, min(_MAX_NAME_BYTES, strings[5] - value), strings[4] + value)
            return raw.split(b"\0", 1)[0].decode("utf-8", "replace") or None
    return None


def _read(fd: int, offset: int, size: int, path: Path) -> bytes:
    if size > _MAX_TABLE_BYTES:
        raise ElfError(f"{path}: an ELF table of {size} bytes is larger than a library has")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ElfError(f"{path} is truncated")
    return data
