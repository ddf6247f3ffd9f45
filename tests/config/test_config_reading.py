"""config.document and config.source: reading a config file never blocks, never grows without bound, and
every failure to load is a ConfigError (what the daemon's reload rejects while it keeps serving).

Tests run as root here, and root reads mode-000 files. `without_file_permission_override` runs code in a
thread that has dropped root's power over file modes (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so a mode-000
directory is as unreadable to it as to any other user; threads it starts inherit that.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.document import MAX_CONFIG_BYTES, MAX_DOCUMENT_DEPTH, read_config_bytes
from nvidia_device_plugin.config.loader import build_config, load_config_file, parse_config
from nvidia_device_plugin.config.source import ConfigSource

T = TypeVar("T")

_CAPABILITY_VERSION_3 = 0x20080522
_DAC_CAPABILITIES = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_dac_capabilities() -> None:
    """Drop the DAC capabilities from this thread's effective set (capabilities are per thread on Linux)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget failed")
    data[0].effective &= ~_DAC_CAPABILITIES
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def without_file_permission_override(action: Callable[[], T]) -> T:
    """`action()`, run in a thread that file modes bind even when it is root; skips where that cannot be."""
    if not sys.platform.startswith("linux"):
        pytest.skip("needs Linux capabilities")
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            if os.geteuid() == 0:
                _drop_dac_capabilities()
            outcome.append(action())
        except BaseException as exc:  # handed to the test's own thread below
            failure.append(exc)

    thread = threading.Thread(target=run, name="no-dac-override")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


def _can_list(directory: Path) -> bool:
    # Not os.access: for root it checks with the permitted capabilities, not the effective ones.
    try:
        os.listdir(directory)
    except PermissionError:
        return False
    return True


@pytest.fixture
def unreadable_dir(tmp_path: Path) -> Iterator[Path]:
    """A ConfigMap-like directory with mode 000 (restored afterwards so tmp_path can be cleaned up)."""
    directory = tmp_path / "configs"
    directory.mkdir()
    (directory / "default").write_text("version: v1\n")
    directory.chmod(0)
    if without_file_permission_override(lambda: _can_list(directory)):
        directory.chmod(0o755)
        pytest.skip("a mode-000 directory stays readable here")
    yield directory
    directory.chmod(0o755)


# --- files that are not regular files, or too big ----------------------------------------------------------


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # nobody ever writes: a blocking open or read would hang here
    with pytest.raises(ConfigError, match=rf"^{fifo}: is a named pipe \(FIFO\), not a regular config file$"):
        load_config_file(fifo)


def test_a_character_device_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"^/dev/null: is a character device, not a regular config file$"):
        load_config_file("/dev/null")


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=rf"^{tmp_path}: is a directory, not a config file$"):
        load_config_file(tmp_path)


def test_a_file_over_the_limit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"version: v1\n" + b"#" * MAX_CONFIG_BYTES)  # valid YAML, just too big
    with pytest.raises(ConfigError, match=rf"^{path}: config file is larger than 1024 KiB"):
        load_config_file(path)


def test_a_file_at_the_limit_is_read(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    head = b"version: v1\n"
    path.write_bytes(head + b"#" * (MAX_CONFIG_BYTES - len(head)))
    assert len(read_config_bytes(path)) == MAX_CONFIG_BYTES
    assert load_config_file(path).version == "v1"


def test_directory_mode_refuses_a_fifo_in_place_of_the_config(tmp_path: Path) -> None:
    (tmp_path / "default").write_text("version: v1\n")
    os.mkfifo(tmp_path / "node")
    source = ConfigSource.from_directory(tmp_path, name="node", default_name="default")
    with pytest.raises(ConfigError, match=r"node: is a named pipe \(FIFO\)"):
        source.load()


def test_directory_mode_refuses_an_oversized_config(tmp_path: Path) -> None:
    (tmp_path / "node").write_bytes(b"#" * (MAX_CONFIG_BYTES + 1))
    source = ConfigSource.from_directory(tmp_path, name="node")
    with pytest.raises(ConfigError, match=r"node: config file is larger than 1024 KiB"):
        source.load()


# --- any failure to load is a ConfigError ------------------------------------------------------------------


def _nested_json(depth: int) -> str:
    return json.dumps({"flags": {"gfd": {"outputFile": "x"}}}).replace('"x"', "[" * depth + "]" * depth)


def test_a_deeply_nested_document_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(_nested_json(700))
    message = rf"^{path}: the document is nested more than {MAX_DOCUMENT_DEPTH} levels deep$"
    with pytest.raises(ConfigError, match=message):
        ConfigSource.from_file(path).load()  # what the daemon's reload calls
    with pytest.raises(ConfigError, match=message):
        load_config_file(path)


def test_a_document_nested_deeper_than_json_allows_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(_nested_json(100_000))
    with pytest.raises(ConfigError, match=rf"^{path}: the document is nested more than"):
        ConfigSource.from_file(path).load()


def test_a_document_that_contains_itself_is_a_config_error() -> None:
    document: dict[str, object] = {"flags": {}}
    document["flags"] = {"gfd": {"outputFile": document}}
    with pytest.raises(ConfigError, match=r"^<config>: the document contains itself"):
        build_config(document, {})
    with pytest.raises(ConfigError, match=r"^<config>: the document contains itself"):
        parse_config(document)


def test_shared_yaml_aliases_are_not_nesting(tmp_path: Path) -> None:
    # 20 levels of lists of two aliases each: 2**20 paths, but each list once; must be checked quickly.
    lines = ["a0: &a0 [x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 21)]
    path = tmp_path / "config.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match=rf"^{path}: a0: unknown field"):
        load_config_file(path)


def test_not_utf8_in_directory_mode_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "node").write_bytes(b"version: v1\nflags: {mpsRoot: \xff}\n")
    source = ConfigSource.from_directory(tmp_path, name="node")
    with pytest.raises(ConfigError, match=r"node: config file is not UTF-8 text \(bad byte at offset 29\)"):
        source.load()


def test_an_unreadable_config_directory_is_a_config_error(unreadable_dir: Path) -> None:
    source = ConfigSource.from_directory(unreadable_dir, name="node", default_name="default")

    def load() -> ConfigError:
        with pytest.raises(ConfigError) as raised:
            source.load()
        return raised.value

    error = without_file_permission_override(load)
    assert str(error) == f"{unreadable_dir / 'node'}: cannot look for the config file: Permission denied"


def test_an_unreadable_config_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("version: v1\n")
    path.chmod(0)

    def load() -> ConfigError:
        with pytest.raises(ConfigError) as raised:
            ConfigSource.from_file(path).load()
        return raised.value

    error = without_file_permission_override(load)
    assert str(error) == f"{path}: cannot read config file: Permission denied"
