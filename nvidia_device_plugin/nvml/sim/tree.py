"""A directory tree the simulator writes (a node's sysfs, procfs, /dev and driver root): files, links and
directories by paths relative to one root, made with plain `os` calls on string paths.

A node's tree is about 270 entries, written at every simulated start. Through pathlib it took 10 ms of
the daemon's start-up on a memory filesystem: a Path made per entry, `mkdir(parents=True)` climbing by
exceptions, `touch` trying `utime` first. The same entries as plain calls take about 3 ms.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


class FileTree:
    """Entries under `root` (an existing directory), each named by a '/'-separated path relative to it.
    Missing parent directories are made as needed."""

    def __init__(self, root: Path | str) -> None:
        self.root = str(root)
        self._directories: set[str] = {""}  # relative paths known to exist

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}" if relative else self.root

    def directory(self, relative: str) -> str:
        """Make directory `relative` (and its parents) if missing; returns its full path."""
        if relative not in self._directories:
            self.directory(relative.rpartition("/")[0])
            with contextlib.suppress(FileExistsError):  # a tree over a directory another tree made
                os.mkdir(self.path(relative))
            self._directories.add(relative)
        return self.path(relative)

    def subtree(self, relative: str) -> FileTree:
        """The tree under directory `relative` (made if missing)."""
        return FileTree(self.directory(relative))

    def file(self, relative: str, content: bytes | str = b"") -> None:
        """Write file `relative` with `content` (text as UTF-8), replacing what was there."""
        self.directory(relative.rpartition("/")[0])
        with open(self.path(relative), "wb") as out:
            out.write(content.encode() if isinstance(content, str) else content)

    def link(self, relative: str, target: str) -> None:
        """Make `relative` a symbolic link to `target` (relative to the link's directory, or absolute)."""
        self.directory(relative.rpartition("/")[0])
        os.symlink(target, self.path(relative))
