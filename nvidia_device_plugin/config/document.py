"""Config documents: reading the file safely, decoding YAML/JSON, and naming the path of a problem.

Reading is bounded and never blocks (boundedio.py, as for every file the node can write): the file is
opened with O_NONBLOCK, checked with fstat on the opened descriptor (so a swap between check and read
cannot fool it) and read up to `MAX_CONFIG_BYTES` + 1 bytes. A FIFO put where the config was would
otherwise block the daemon in read() (deaf to SIGTERM), and /dev/zero would grow its memory without limit.

Everything that can go wrong between the path and the decoded document (missing, unreadable, not a regular
file, too big, not UTF-8, bad syntax, nested too deep, refers to itself) is a ConfigError naming the source,
so a reload rejects the config and the daemon keeps serving the last good one.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping, Sequence
from typing import BinaryIO, NoReturn

from nvidia_device_plugin.base import boundedio
from nvidia_device_plugin.base.errors import ConfigError
from nvidia_device_plugin.config.v1 import VERSION, shown_int

# NVIDIA's largest example configs are a few KiB; a ConfigMap holds at most 1 MiB in all.
MAX_CONFIG_BYTES = 1024 * 1024
# The v1 format nests 6 levels at most; the margin leaves room for odd but valid files while keeping
# every later step (copying, overrides, error messages) far from Python's recursion limit.
MAX_DOCUMENT_DEPTH = 32


class Invalid(Exception):
    """A problem at one path of the document; `text` is the complete sentence, starting with the path."""

    def __init__(self, path: str, text: str) -> None:
        super().__init__(text)
        self.path = path
        self.text = text


class Problems(Exception):
    """Every problem found in one document, in document order (at least one)."""

    def __init__(self, problems: Sequence[Invalid]) -> None:
        super().__init__("; ".join(p.text for p in problems))
        self.problems = tuple(problems)


# ---------------------------------------------------------------------------------------------------------
# Reading and decoding


def read_config_bytes(path: str | os.PathLike[str], limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; ConfigError naming `path` for anything else."""
    source = os.fspath(path)
    try:
        # Symlinks anywhere: config-manager points the config file at one in another directory.
        return boundedio.read_bytes(source, limit, symlinks="any")
    except FileNotFoundError:
        raise ConfigError(f"{source}: config file not found") from None
    except boundedio.RefusedFile as exc:
        if exc.kind == "directory":
            raise ConfigError(f"{source}: is a directory, not a config file") from None
        if exc.kind == "too-big":
            raise ConfigError(_too_big(source, limit)) from None
        if _links_to_dev_null(source):
            return b""  # NVIDIA's config-manager links /dev/null for its `empty` fallback: the empty config
        raise ConfigError(f"{source}: is a {exc.file_kind}, not a regular config file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read config file: {exc.strerror or exc}") from None


def _links_to_dev_null(source: str) -> bool:
    """Whether `source` is a symlink (config-manager's) to /dev/null; /dev/null named itself is refused."""
    try:
        if not os.path.islink(source):
            return False
        found, null = os.stat(source), os.stat(os.devnull)
    except OSError:
        return False
    return stat.S_ISCHR(found.st_mode) and found.st_rdev == null.st_rdev


def _too_big(source: str, limit: int) -> str:
    return f"{source}: config file is larger than {limit // 1024} KiB; this cannot be a device-plugin config"


def read_config_document(path: str | os.PathLike[str]) -> object:
    """The decoded document in a YAML or JSON file (None when the file is empty)."""
    return decode_config_bytes(read_config_bytes(path), os.fspath(path))


def read_config_stream(stream: BinaryIO, source: str, limit: int = MAX_CONFIG_BYTES) -> object:
    """The decoded document read from `stream` (check-config's `-`: standard input), bounded as a file is."""
    try:
        data = stream.read(limit + 1)  # returns at end of input, or once one byte more than allowed came
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read the config: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise ConfigError(_too_big(source, limit))
    return decode_config_bytes(data, source)


def decode_config_bytes(data: bytes, source: str) -> object:
    """UTF-8 YAML or JSON bytes -> the decoded document (None when empty); ConfigError naming `source`."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"{source}: config file is not UTF-8 text (bad byte at offset {exc.start})"
        ) from None
    return parse_document_text(text, source)


def parse_document_text(text: str, source: str = "<config>") -> object:
    """YAML (or JSON) text -> the decoded document; syntax errors become ConfigErrors with the line number.

    The document's shape (`check_document_shape`) is checked when it is parsed into a Config.
    """
    if text.lstrip().startswith("{"):
        # JSON first: PyYAML is YAML 1.1 and trips over some valid JSON (tabs, for one).
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # a YAML flow mapping also starts with "{"; let the YAML parser judge it
        except RecursionError:
            raise ConfigError(_too_deep(source)) from None
        except ValueError as exc:
            raise ConfigError(f"{source}: the document cannot be read: {exc}") from None
    # Here: PyYAML (and libyaml) load only when a document is read; NVIDIA's default deployment gives the
    # plugin no config file, and then a start never needs them (about 12 ms and 0.7 MB).
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise ConfigError(f"{source}: invalid YAML{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(_too_deep(source)) from None
    except ValueError as exc:  # e.g. an integer literal beyond Python's digit limit
        raise ConfigError(f"{source}: the document cannot be read: {exc}") from None


def _too_deep(source: str) -> str:
    return f"{source}: the document is nested more than {MAX_DOCUMENT_DEPTH} levels deep"


def check_document_shape(document: object) -> None:
    """Refuse documents nested deeper than `MAX_DOCUMENT_DEPTH` or containing themselves (a YAML alias
    inside its own anchor), so nothing later can recurse without bound. Iterative: it cannot overflow.
    """
    on_path: set[int] = set()  # ids of the containers between the root and the current node
    done: set[int] = set()  # containers already checked (YAML aliases share them)
    stack: list[tuple[object, int, bool]] = [(document, 1, False)]
    while stack:
        node, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            done.add(id(node))
            continue
        if not isinstance(node, (dict, list)) or id(node) in done:
            continue
        if id(node) in on_path:
            raise Invalid("", "the document contains itself (a YAML alias used inside its own anchor)")
        if depth > MAX_DOCUMENT_DEPTH:
            raise Invalid("", f"the document is nested more than {MAX_DOCUMENT_DEPTH} levels deep")
        on_path.add(id(node))
        stack.append((node, depth, True))
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1, False) for child in children)


def check_version(version: object) -> None:
    """The document's `version`: missing or empty means v1, as for NVIDIA."""
    if version is not None and not isinstance(version, str):
        fail_type("version", "a string", version)
    if version not in (None, "", VERSION):
        fail("version", f"unsupported config version {version!r} (supported: {VERSION})")


# ---------------------------------------------------------------------------------------------------------
# Naming the problem: paths, values, origins


def join_path(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def origin_of(path: str, origins: Mapping[str, str]) -> str | None:
    """The origin of the longest overridden path that `path` is, or lies under."""
    best: tuple[int, str] | None = None
    for prefix, origin in origins.items():
        under = path == prefix or path.startswith((prefix + ".", prefix + "["))
        if under and (best is None or len(prefix) > best[0]):
            best = (len(prefix), origin)
    return best[1] if best is not None else None


def show(value: object, depth: int = 0) -> str:
    """A short YAML-flavoured rendering of a bad value, for error messages."""
    if isinstance(value, str):
        return repr(value if len(value) <= 60 else value[:57] + "...")
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return shown_int(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, Mapping):
        if depth >= 1:
            return "{...}" if value else "{}"
        items = [f"{show(k, depth + 1)}: {show(v, depth + 1)}" for k, v in list(value.items())[:4]]
        return "{" + ", ".join(items) + (", ..." if len(value) > 4 else "") + "}"
    if isinstance(value, (list, tuple)):
        if depth >= 1:
            return "[...]" if value else "[]"
        shown = [show(v, depth + 1) for v in value[:6]]
        return "[" + ", ".join(shown) + (", ..." if len(value) > 6 else "") + "]"
    return f"a {type(value).__name__} ({str(value)[:40]})"


def fail(path: str, message: str) -> NoReturn:
    raise Invalid(path, f"{path}: {message}")


def fail_type(path: str, expected: str, value: object) -> NoReturn:
    raise Invalid(path, f"{path} must be {expected}, got {show(value)}")


def fail_choice(path: str, choices: Sequence[str], value: object, hint: str = "") -> NoReturn:
    raise Invalid(path, f"{path} must be one of {', '.join(choices)}, got {show(value)}{hint}")
