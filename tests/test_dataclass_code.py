"""base/dataclass_code.py: dataclasses' methods served from the cache are the ones Python compiles, and
anything the cache cannot vouch for is compiled as before.

Each test makes a package of its own under tmp_path (a unique name, so the process-wide hook and its
state never mix tests), builds its cache with `build`, and imports its module afresh.
"""

from __future__ import annotations
import __future__

import dataclasses
import importlib
import itertools
import marshal
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import CodeType, ModuleType

import pytest

from nvidia_device_plugin.base import dataclass_code

MODULE = '''
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Point:
    """A value."""

    x: int
    y: int = 0
    tags: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Twin:
    """The same fields as Point's first two: the same __setattr__ source, cached twice."""

    x: int
    y: int = 0


@dataclass
class Mutable:
    name: str
'''
_names = itertools.count()


@pytest.fixture
def package(tmp_path: Path) -> Iterator[str]:
    """A fresh package `<name>` with the module `<name>.values` (MODULE), importable from tmp_path."""
    name = f"dccache_test_{next(_names)}_{abs(hash(tmp_path)) % 10**6}"
    root = tmp_path / name
    root.mkdir()
    (root / "__init__.py").write_text("")
    (root / "values.py").write_text(MODULE)
    sys.path.insert(0, str(tmp_path))
    try:
        yield name
    finally:
        sys.path.remove(str(tmp_path))
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def _fresh(package: str) -> ModuleType:
    sys.modules.pop(f"{package}.values", None)
    return importlib.import_module(f"{package}.values")


def _cache_path(package: str) -> Path:
    module = importlib.import_module(f"{package}.values")
    return dataclass_code.cache_file(str(module.__file__))


def _entries(path: Path) -> list[tuple[str, CodeType]]:
    data = path.read_bytes()
    magic = importlib.util.MAGIC_NUMBER
    assert data.startswith(magic)
    return list(marshal.loads(data[len(magic) :]))


def _write_entries(path: Path, entries: list[tuple[str, CodeType]]) -> None:
    path.write_bytes(importlib.util.MAGIC_NUMBER + marshal.dumps(tuple(entries)))


def _plain(package: str, file: str | None = None) -> ModuleType:
    """MODULE made by dataclasses alone: as a module no cache serves (at `file`, when given)."""
    module = ModuleType(f"uncached_{package}")
    if file is not None:
        module.__file__ = file
    sys.modules[module.__name__] = module
    try:
        exec(compile(MODULE, "<uncached>", "exec", dont_inherit=True), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def test_build_writes_a_file_per_module_with_every_method_compiled(package: str) -> None:
    written = dataclass_code.build(package)
    path = _cache_path(package)
    assert written == [path]
    entries = _entries(path)
    # Point and Twin: __init__, __repr__, __eq__, __hash__, __setattr__, __delattr__; Mutable: 3 (3.11-3.12),
    # or one source per class (3.13 compiles a class's methods together).
    assert len(entries) in (15, 3)
    assert all(isinstance(source, str) and isinstance(code, CodeType) for source, code in entries)


def test_methods_served_from_the_cache_are_those_python_compiles(package: str) -> None:
    dataclass_code.build(package)
    cached, plain = _fresh(package), _plain(package)
    assert f"{package}.values" not in dataclass_code.compiled()
    for name in ("Point", "Twin", "Mutable"):
        for method in ("__init__", "__repr__", "__eq__", "__setattr__", "__delattr__", "__hash__"):
            ours, theirs = getattr(getattr(cached, name), method), getattr(getattr(plain, name), method)
            if hasattr(theirs, "__code__"):
                assert ours.__code__ == theirs.__code__, (name, method)
                assert ours.__annotations__ == theirs.__annotations__, (name, method)
    point = cached.Point(1, tags=("a",))
    assert point == cached.Point(1, 0, ("a",)) and hash(point) == hash(cached.Point(1, 0, ("a",)))
    assert repr(point) == "Point(x=1, y=0, tags=('a',))"
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    assert cached.Point.__init__.__annotations__["x"] == "int"  # the module's own future import, kept


def test_the_cache_is_what_is_served(package: str) -> None:
    """A file whose __repr__ says otherwise is believed: proof the methods come from it, not compile."""
    dataclass_code.build(package)
    path = _cache_path(package)
    forged = []
    for source, code in _entries(path):
        if "def __repr__" in source:
            fake = (
                source.split(" def __repr__")[0]
                + " def __repr__(self):\n  return 'from the cache'\n return __repr__"
            )
            code = compile(fake, "<string>", "exec", dont_inherit=True)
        forged.append((source, code))
    _write_entries(path, forged)
    assert repr(_fresh(package).Point(1)) == "from the cache"


def test_sources_the_cache_does_not_hold_are_compiled(package: str) -> None:
    dataclass_code.build(package)
    path = _cache_path(package)
    entries = _entries(path)
    changed = [(source.replace("x", "renamed"), code) for source, code in entries]
    _write_entries(path, changed)
    altered = sum(old != new for (old, _), (new, _) in zip(entries, changed, strict=True))
    module = _fresh(package)
    assert repr(module.Point(1)) == "Point(x=1, y=0, tags=())"
    assert module.Twin(2) == module.Twin(2, 0)
    # Point's and Twin's sources name x and no longer match; Mutable's are still served.
    assert dataclass_code.compiled()[f"{package}.values"] == altered < len(entries)


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"\0\0\0\0" + data[4:],  # another interpreter's magic number
        lambda data: data[: len(data) // 2],  # cut short
        lambda data: data + b"\0" * dataclass_code.MAX_FILE_BYTES,  # past the bound
        lambda data: importlib.util.MAGIC_NUMBER + marshal.dumps({"not": "entries"}),
        lambda data: importlib.util.MAGIC_NUMBER + marshal.dumps((("source", 1), "x")),
    ],
)
def test_a_damaged_file_is_ignored(package: str, damage: object) -> None:
    dataclass_code.build(package)
    path = _cache_path(package)
    path.write_bytes(damage(path.read_bytes()))  # type: ignore[operator]
    module = _fresh(package)
    assert repr(module.Point(1)) == "Point(x=1, y=0, tags=())"
    assert module.Mutable("a") == module.Mutable("a")


def test_modules_of_other_packages_are_not_served(package: str) -> None:
    """The same source in a module outside the served packages, even at a file whose cache holds it:
    compiled, with dataclasses' futures."""
    dataclass_code.build(package)
    path = _cache_path(package)
    _write_entries(
        path, [(source, compile("raise AssertionError", "<string>", "exec")) for source, _ in _entries(path)]
    )
    plain = _plain(package, str(importlib.import_module(f"{package}.values").__file__))
    assert plain.Point(1) == plain.Point(1)
    assert not plain.Point.__init__.__code__.co_flags & __future__.annotations.compiler_flag


def test_the_command_builds_the_packages_cache(tmp_path: Path) -> None:
    """`python -m nvidia_device_plugin.base.dataclass_code` as make and the image build run it, on a copy
    of the package (the work tree's own cache is make's to write)."""
    copy = tmp_path / "nvidia_device_plugin"
    source = Path(dataclass_code.__file__).parents[1]
    shutil.copytree(source, copy)
    for old in copy.rglob("*.marshal"):
        old.unlink()
    done = subprocess.run(
        [sys.executable, "-m", "nvidia_device_plugin.base.dataclass_code"],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "left out" not in done.stderr
    written = sorted(p.relative_to(copy).as_posix() for p in copy.rglob("*.marshal"))
    assert any(p.startswith("__pycache__/devices.dataclasses.") for p in written), written
    assert any(p.startswith("config/__pycache__/v1.dataclasses.") for p in written), written
    assert done.stdout.strip() == f"dataclass cache: {len(written)} modules"
