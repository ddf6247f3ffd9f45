"""The compiled methods of the package's dataclasses, kept on disk as Python keeps modules' bytecode.

A `@dataclass` writes the source of its methods (__init__, __repr__, __eq__; __hash__, __setattr__ and
__delattr__ when frozen) and compiles it while its module is imported: about 0.7 of the 1 ms each class
costs, and `run` makes 80-odd before it registers (docs/performance.md: 50-60 ms of every start). Python's
__pycache__ holds a module's own bytecode, not these. `install()` (cli/__init__.py, so every program of the
package) serves them from files `build()` wrote, one per module in its __pycache__:
`python -m nvidia_device_plugin.base.dataclass_code`, which `make`, `make bench` and the image build run.

Nothing but the time changes. What is served is the code `compile` made of the very same source text
(compared whole, not by a digest) under the same interpreter (the file's name carries its cache tag, and
it starts with importlib's MAGIC_NUMBER), compiled as dataclasses' own `exec` compiles it: with
dataclasses' future imports, not this module's, and the file name "<string>". A source the file does not
hold (the class changed since), a missing, stale, damaged or oversized file, a module outside the
package, or a Python whose dataclasses no longer look up `exec` in their module (3.11 to 3.13 all do),
compile as before.
"""

from __future__ import annotations
import __future__

import builtins
import dataclasses
import functools
import importlib
import importlib.util
import marshal
import operator
import os
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import CodeType
from typing import Any

from nvidia_device_plugin.base.boundedio import read_bytes

PACKAGE = "nvidia_device_plugin"
MAX_FILE_BYTES = 1 << 20  # the largest module's file (config/v1.py): under 100 KiB; a bigger one is not ours
_SUFFIX = f".dataclasses.{sys.implementation.cache_tag}.marshal"
_MAGIC = importlib.util.MAGIC_NUMBER
# exec(source) compiles with the future imports of the code that calls it: dataclasses', not ours.
_FLAGS: int = dataclasses.dataclass.__code__.co_flags & functools.reduce(
    operator.or_, (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
)

# Per module: the cached code by its source (once per time the module compiles it: two classes with the
# same fields share a __setattr__), loaded at the module's first dataclass and emptied as it is used, so
# neither the sources nor the code that only makes the methods outlive the classes.
_loaded: dict[str, dict[str, list[CodeType]]] = {}
_lock = threading.Lock()  # guards _loaded and _compiled
_served: set[str] = set()  # the prefixes of the modules served ("nvidia_device_plugin.")
_compiled: dict[str, int] = {}  # per module served: sources compiled for want of a cached one
# While build() runs: every source compiled or served, by module, in order.
_recording: dict[str, list[tuple[str, CodeType]]] | None = None


def install(package: str = PACKAGE) -> None:
    """Serve the methods of `package`'s dataclasses from the cache from now on (idempotent)."""
    _served.add(package + ".")
    dataclasses.exec = _exec  # type: ignore[attr-defined]  # a module global their `exec(...)` finds first


def compiled() -> dict[str, int]:
    """How many method sources each served module compiled for want of a cached one (no file, or one
    from before the module changed); empty when the cache served everything."""
    return dict(_compiled)


def cache_file(module_file: str) -> Path:
    """Where the methods of the module at `module_file` are cached."""
    return Path(_cache_path(module_file))


def _cache_path(module_file: str) -> str:
    # os.path, not pathlib: this runs for every module with a dataclass at every start, and pathlib's
    # objects took 1.6 ms of a start (40 modules).
    directory, name = os.path.split(module_file)
    stem = name.rpartition(".")[0] or name  # Path.stem: "v1.py" -> "v1"
    return os.path.join(directory, "__pycache__", f"{stem}{_SUFFIX}")


def _exec(
    source: object, globals: dict[str, Any] | None = None, locals: Mapping[str, object] | None = None
) -> None:
    """dataclasses' `exec(source, globals, ns)`, with the source compiled from the cache where it can be."""
    if isinstance(source, str):
        scope = globals if globals is not None else {}
        module = scope.get("__name__")
        if isinstance(module, str) and module.startswith(tuple(_served)):
            source = _code(module, scope.get("__file__"), source)
        else:  # compiled here, as exec would compile it in dataclasses (not with this module's futures)
            source = _compile(source)
    builtins.exec(source, globals, locals)  # type: ignore[arg-type]


def _compile(source: str) -> CodeType:
    code: CodeType = compile(source, "<string>", "exec", flags=_FLAGS, dont_inherit=True)
    return code


def _code(module: str, module_file: object, source: str) -> CodeType:
    code = _cached(module, module_file, source)
    if code is None:
        code = _compile(source)
        with _lock:
            _compiled[module] = _compiled.get(module, 0) + 1
    if _recording is not None:
        _recording.setdefault(module, []).append((source, code))
    return code


def _cached(module: str, module_file: object, source: str) -> CodeType | None:
    """The cached code of `source`, taken (each is served once); None when the cache has none."""
    with _lock:  # a dataclass made inside a function may be made by two threads at once
        cached = _loaded.get(module)
        if cached is None:
            cached = _loaded[module] = _read(module_file) if isinstance(module_file, str) else {}
        codes = cached.get(source)
        if not codes:
            return None
        code = codes.pop()
        if not codes:
            del cached[source]
        return code


def _read(module_file: str) -> dict[str, list[CodeType]]:
    """The cached code of one module; empty when there is no usable file."""
    try:
        # boundedio's descriptor-level read (refused past the bound, an OSError), not open(): the io
        # stack's objects took 2.5 ms of a start (40 modules).
        data = read_bytes(_cache_path(module_file), MAX_FILE_BYTES, symlinks="any")
        if not data.startswith(_MAGIC):
            return {}
        entries = marshal.loads(data[len(_MAGIC) :])
    except (OSError, EOFError, ValueError, TypeError):
        return {}
    cached: dict[str, list[CodeType]] = {}
    for entry in entries if isinstance(entries, tuple) else ():
        if isinstance(entry, tuple) and len(entry) == 2:
            source, code = entry
            if isinstance(source, str) and isinstance(code, CodeType):
                cached.setdefault(source, []).append(code)
    return cached


def build(package: str = PACKAGE) -> list[Path]:
    """Import every module of `package`, recording their dataclasses' methods, and write each module's
    file (replacing the previous one). Returns the files written; a module that fails to import is named
    on stderr and left out (the cache only saves time)."""
    import pkgutil  # here: only the build walks the package (every program imports this module)

    global _recording
    install(package)
    _recording = {}
    try:
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            try:
                importlib.import_module(info.name)
            except Exception as exc:  # any failure only leaves that module uncached
                print(f"dataclass cache: {info.name} left out: {exc}", file=sys.stderr)
        recorded = _recording
    finally:
        _recording = None
        _loaded.clear()  # read the new files at the next import
        _compiled.clear()
    return [_write(sys.modules[name], entries) for name, entries in sorted(recorded.items())]


def _write(module: object, entries: list[tuple[str, CodeType]]) -> Path:
    path = cache_file(str(getattr(module, "__file__", "")))
    path.parent.mkdir(exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_bytes(_MAGIC + marshal.dumps(tuple(entries)))
    os.replace(temporary, path)
    return path


if __name__ == "__main__":
    # The package's instance of this module, not __main__'s: install() and the recording live there.
    from nvidia_device_plugin.base import dataclass_code

    written = dataclass_code.build()
    print(f"dataclass cache: {len(written)} modules")
