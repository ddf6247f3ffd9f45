"""Replacing a file atomically: readers (a container runtime, NFD, the other MPS daemon) see the old
content or the new, never a half-written file.

The text goes to a temporary file in the same directory (rename(2) is atomic only within a file system),
is flushed to disk, gets its mode, and is renamed over the target. On failure the temporary file is
removed and the OSError is raised for the caller to word.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def replace_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Make `path` hold exactly `text` (UTF-8) with permissions `mode`, atomically."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), mode)
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
