"""The simulator's FileTree: entries by relative path, parents made as needed, links as given."""

from __future__ import annotations

import os
from pathlib import Path

from nvidia_device_plugin.nvml.sim.tree import FileTree


def test_files_links_and_directories_land_where_named_with_their_parents(tmp_path: Path) -> None:
    tree = FileTree(tmp_path)
    tree.file("a/b/c.txt", "text\n")
    tree.file("a/b/d.bin", b"\x7fELF")
    tree.file("a/empty")
    tree.link("a/b/c.link", "c.txt")
    assert tree.directory("x/y") == str(tmp_path / "x" / "y")
    assert (tmp_path / "a/b/c.txt").read_text() == "text\n"
    assert (tmp_path / "a/b/d.bin").read_bytes() == b"\x7fELF"
    assert (tmp_path / "a/empty").read_bytes() == b""
    assert os.readlink(tmp_path / "a/b/c.link") == "c.txt"
    assert (tmp_path / "a/b/c.link").read_text() == "text\n"
    assert (tmp_path / "x/y").is_dir()


def test_a_file_is_replaced_and_a_subtree_shares_directories_made_by_another_tree(tmp_path: Path) -> None:
    tree = FileTree(tmp_path)
    tree.file("dev/nvidia0", "old")
    tree.file("dev/nvidia0", "new")
    dev = tree.subtree("dev")
    dev.file("nvidia-caps/nvidia-cap3")
    tree.file("dev/nvidia-caps/nvidia-cap4")  # the directory the subtree made, unknown to this tree
    assert (tmp_path / "dev/nvidia0").read_text() == "new"
    assert sorted(p.name for p in (tmp_path / "dev/nvidia-caps").iterdir()) == ["nvidia-cap3", "nvidia-cap4"]
    assert dev.path("nvidia0") == str(tmp_path / "dev/nvidia0")
