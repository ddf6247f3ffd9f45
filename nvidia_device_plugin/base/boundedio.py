"""Reading files the node can write, bounded: the one way the package reads a file it did not just write.

Every reader of a node-writable file (MPS status and pid files, procfs and sysfs entries, existing CDI
specs, the machine-type file, the config file) goes through `read_bytes` / `read_text`, which:

* open with O_NONBLOCK (a FIFO put in the file's place would otherwise block the reader in open() or
  read(), deaf to SIGTERM) and check the opened descriptor with fstat, so a swap between a check and the
  read cannot fool it;
* read regular files only: a directory, FIFO, socket or device (/dev/zero) is refused, naming its kind;
* read at most `limit` bytes: a bigger file is refused (or, with `truncate`, cut at the limit), so a
  512 MB file or one still growing cannot take the daemon's memory;
* with `symlinks="within"` (the default), follow a symlink only when it resolves inside the file's own
  directory (a ConfigMap's `..data/key` links do; a link to /etc/shadow or /dev/zero does not), and open
  the resolved path with O_NOFOLLOW. The config file takes `symlinks="any"`: config-manager points it at a
  file in another directory on purpose.

A refusal is a `RefusedFile`, an OSError, so a caller's existing `except OSError` keeps its meaning; its
`strerror` is the operator's sentence ("is a named pipe (FIFO), not a regular file").
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Literal

SymlinkPolicy = Literal["within", "any"]
RefusalKind = Literal["directory", "special", "too-big", "symlink"]

KIB = 1024
SMALL_FILE_BYTES = 4 * KIB  # a sysfs or procfs value, a pid file: the kernel's page size bounds them
_CHUNK = 64 * KIB
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class RefusedFile(OSError):
    """A file this package does not read: not a regular file, too big, or a symlink out of its directory."""

    def __init__(self, path: str, kind: RefusalKind, problem: str, code: int, file_kind: str = "") -> None:
        super().__init__(code, problem, path)
        self.kind = kind
        self.file_kind = file_kind  # for "special": "named pipe (FIFO)", "character device", ...

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def read_bytes(
    path: str | os.PathLike[str],
    limit: int,
    *,
    symlinks: SymlinkPolicy = "within",
    truncate: bool = False,
) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them.

    Raises FileNotFoundError (and the other OSErrors of open and read) as the OS gives them, and
    RefusedFile for a file that is not read. A file over `limit` is refused, or cut there with `truncate`.
    """
    source = os.fspath(path)
    fd = open_regular(source, symlinks)
    try:
        info = os.fstat(fd)
        if info.st_size > limit and not truncate:
            raise _too_big(source, limit)
        data = _read_up_to(fd, limit if truncate else limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew after fstat, or fstat does not know its size (procfs says 0)
        raise _too_big(source, limit)
    return data


def read_text(
    path: str | os.PathLike[str],
    limit: int,
    *,
    symlinks: SymlinkPolicy = "within",
    truncate: bool = False,
    errors: str = "strict",
) -> str:
    """`read_bytes` decoded as UTF-8 (a decoding error is a ValueError unless `errors` says otherwise)."""
    return read_bytes(path, limit, symlinks=symlinks, truncate=truncate).decode("utf-8", errors)


def open_regular(path: str | os.PathLike[str], symlinks: SymlinkPolicy = "within") -> int:
    """A non-blocking read-only descriptor of the regular file `path` (the caller closes it).

    For readers that follow a file as it grows (the simulated events feed): the same checks as
    read_bytes, without the size bound.
    """
    source = os.fspath(path)
    if symlinks == "any":
        fd = os.open(source, _OPEN_FLAGS)
    else:
        fd = os.open(_resolved_within(source), _OPEN_FLAGS | os.O_NOFOLLOW)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise RefusedFile(source, "directory", "is a directory, not a regular file", errno.EISDIR)
        if not stat.S_ISREG(mode):
            kind = file_kind(mode)
            raise RefusedFile(source, "special", f"is a {kind}, not a regular file", errno.EINVAL, kind)
    except BaseException:
        os.close(fd)
        raise
    return fd


def file_kind(mode: int) -> str:
    """What a file that is not regular is, in an operator's words."""
    if stat.S_ISFIFO(mode):
        return "named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "special file"


def shown_size(size: int) -> str:
    """A byte count as an operator reads it: "4 KiB", "1 MiB", "300 bytes"."""
    for unit, scale in (("MiB", KIB * KIB), ("KiB", KIB)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def _resolved_within(source: str) -> str:
    """`source` with its symlinks resolved, refused when that leaves the directory `source` is in."""
    directory = os.path.realpath(os.path.dirname(os.path.abspath(source)))
    name = os.path.basename(source)
    if ".." in source or name in ("", "."):
        real = os.path.realpath(source)  # resolved whole: abspath above took ".." lexically
    else:
        # With its directory resolved, only the name itself can still be a link: one lstat, not another
        # walk of every component (a sysfs path has eight or more; discovery reads dozens of them).
        candidate = os.path.join(directory, name)
        real = os.path.realpath(candidate) if os.path.islink(candidate) else candidate
    if os.path.dirname(real) != directory and os.path.commonpath([real, directory]) != directory:
        raise RefusedFile(
            source,
            "symlink",
            f"is a symlink to {real}, outside its directory {directory}; not followed",
            errno.ELOOP,
        )
    return real


def _read_up_to(fd: int, count: int) -> bytes:
    chunks: list[bytes] = []
    remaining = count
    while remaining > 0:
        chunk = os.read(fd, min(remaining, _CHUNK))
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _too_big(source: str, limit: int) -> RefusedFile:
    return RefusedFile(source, "too-big", f"is larger than {shown_size(limit)}; not read", errno.EFBIG)
