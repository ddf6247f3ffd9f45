"""What the benchmark's children see: a minimal environment whose temporary files are in memory.

A simulated node writes its host tree (sysfs, procfs, /dev, a driver root) under TMPDIR before it serves; on
a disk that measured the disk, not the plugin's start-up (bench/procs.py says why).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, where bench/ lives

from bench import procs

MEMORY_TMPDIR = Path("/dev/shm")
HAS_MEMORY_TMPDIR = MEMORY_TMPDIR.is_dir() and os.access(MEMORY_TMPDIR, os.W_OK | os.X_OK)


@pytest.mark.skipif(not HAS_MEMORY_TMPDIR, reason="no writable /dev/shm")
def test_children_write_temporary_files_to_memory_when_no_tmpdir_is_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TMPDIR", raising=False)
    assert procs.child_env()["TMPDIR"] == str(MEMORY_TMPDIR)


def test_a_tmpdir_given_by_the_caller_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    assert procs.child_env()["TMPDIR"] == str(tmp_path)
