"""Putting CDI specs into the spec directory, and keeping only the ones the daemon still needs.

A spec is written to a temporary file in the same directory and renamed over the old one, so a runtime
never reads half a spec; files are 0644 (runtimes read them as another user). Ours are the files named
`k8s.device-plugin.nvidia.com-<class>.json` (and our temporary files): any of them not in the current set
is removed after the new ones are in place. A name a spec of ours defined stays defined, though, while
kubelet's checkpoint still holds a response naming it (retention.py): a running pod's container restarts
with the names it was admitted with, whatever the config says now.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nvidia_device_plugin.base.atomicfile import replace_file
from nvidia_device_plugin.base.boundedio import read_bytes, read_text
from nvidia_device_plugin.base.logs import FailureLog
from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiError, CdiPlan, CdiSpec
from nvidia_device_plugin.cdi.retention import (
    MAX_SPEC_BYTES,
    names_in_use,
    retain,
    spec_document,
)

log = logging.getLogger(__name__)

SPEC_FILE_MODE = 0o644
_OURS_PREFIX = f"{CDI_VENDOR}-"
_TEMP_PREFIX = f".{CDI_VENDOR}-"


@dataclass(frozen=True)
class WriteResult:
    """What one publish changed in the CDI spec directory."""

    written: tuple[str, ...]  # file names whose content changed
    removed: tuple[str, ...]  # our file names no longer needed


def spec_json(spec: CdiSpec) -> str:
    return json.dumps(spec.document, indent=2) + "\n"


def write_specs(spec_dir: Path, specs: Sequence[CdiSpec]) -> WriteResult:
    """Write `specs` into `spec_dir` (created if missing) and remove our other spec files there."""
    try:
        spec_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CdiError(f"cannot create the CDI spec directory {spec_dir}: {exc.strerror or exc}") from exc
    written = []
    for spec in specs:
        if _write_if_changed(spec_dir / spec.file_name, spec_json(spec)):
            written.append(spec.file_name)
    keep = {spec.file_name for spec in specs}
    removed = remove_specs(spec_dir, keep)
    return WriteResult(tuple(written), removed)


def our_spec_files(spec_dir: Path) -> list[str]:
    """The names of our spec files in `spec_dir` (none when it does not exist)."""
    try:
        names = os.listdir(spec_dir)
    except (FileNotFoundError, NotADirectoryError):  # none yet (write_specs says why it cannot make it)
        return []
    except OSError as exc:
        raise CdiError(f"cannot read the CDI spec directory {spec_dir}: {exc.strerror or exc}") from exc
    return sorted(n for n in names if n.startswith(_OURS_PREFIX) and n.endswith(".json"))


def read_our_specs(spec_dir: Path) -> dict[str, dict[str, Any]]:
    """Our spec documents in `spec_dir` (file name -> document); files that are not specs are left out."""
    documents = {}
    for name in our_spec_files(spec_dir):
        try:
            document = spec_document(read_bytes(spec_dir / name, MAX_SPEC_BYTES))
        except (OSError, CdiError):
            continue
        if document is not None:
            documents[name] = document
    return documents


def remove_specs(spec_dir: Path, keep: set[str] | frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Remove our spec files (and leftover temporary files) in `spec_dir` except those in `keep`."""
    try:
        names = os.listdir(spec_dir)
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise CdiError(f"cannot read the CDI spec directory {spec_dir}: {exc.strerror or exc}") from exc
    removed = []
    for name in sorted(names):
        ours = name.startswith(_OURS_PREFIX) and name.endswith(".json")
        if not (ours or name.startswith(_TEMP_PREFIX)) or name in keep:
            continue
        try:
            (spec_dir / name).unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise CdiError(
                f"cannot remove the stale CDI spec {spec_dir / name}: {exc.strerror or exc}"
            ) from exc
        if ours:
            removed.append(name)
    return tuple(removed)


def _write_if_changed(path: Path, text: str) -> bool:
    try:
        if read_text(path, len(text.encode())) == text and (path.stat().st_mode & 0o777) == SPEC_FILE_MODE:
            return False
    except (OSError, ValueError):
        pass  # missing, unreadable, not a regular file, bigger than ours, not UTF-8: (re)write it
    try:
        replace_file(path, text, SPEC_FILE_MODE)
    except OSError as exc:
        raise CdiError(f"cannot write the CDI spec {path}: {exc.strerror or exc}") from exc
    return True


class CdiPublisher:
    """Keeps the spec directories in step with the served snapshot; logs once per state change.

    `publish` returns None when every CDI name Allocate can return is defined by a written spec, else why
    not; the daemon then serves no resource (Allocate would answer names no runtime can resolve). Every
    directory it has written to (or found specs of ours in) keeps the names kubelet may still replay.
    `checkpoint` is kubelet's device-manager checkpoint; None: no kubelet holds any name.
    """

    def __init__(self, checkpoint: Path | None = None) -> None:
        self.problem: str | None = None
        self.kept: tuple[str, ...] = ()  # names defined only because admitted containers hold them
        self._checkpoint = checkpoint
        self._defined: dict[Path, dict[str, dict[str, Any]]] = {}  # directory -> file -> document
        self._failures = FailureLog(log)

    def publish(self, plan: CdiPlan | None) -> str | None:
        for note in plan.notes if plan is not None else ():  # each logged once in the process's life
            self._failures.report(f"note {note}", f"CDI: {note}")
        wanted = Path(plan.spec_dir) if plan is not None else None
        specs = plan.specs if plan is not None and plan.problem is None else ()
        problem = plan.problem if plan is not None else None
        in_use = self._in_use()
        kept: list[str] = []
        for directory in sorted({*self._defined, *([wanted] if wanted is not None else [])}):
            failure = self._publish_dir(directory, specs if directory == wanted else (), in_use, kept)
            if failure is not None and directory == wanted:
                problem = problem or f"cannot write the CDI spec: {failure}"
        self._report_kept(tuple(kept))
        self.problem = problem
        return problem

    def _publish_dir(
        self, directory: Path, specs: Sequence[CdiSpec], in_use: frozenset[str] | None, kept: list[str]
    ) -> str | None:
        """Write `specs` and the names to keep into `directory`; why not, when it cannot be done."""
        try:
            previous = self._defined[directory] if directory in self._defined else read_our_specs(directory)
            merged, retained = retain(previous, specs, in_use)
            result = write_specs(directory, merged)
        except CdiError as exc:
            self._failures.report(f"dir {directory}", f"CDI: {exc}", logging.ERROR)
            return str(exc)
        if self._failures.clear(f"dir {directory}"):
            log.info("CDI: the spec directory %s can be written again", directory)
        kept += retained
        self._defined[directory] = {s.file_name: s.document for s in merged}
        if not merged:
            del self._defined[directory]
        for spec in merged:
            if spec.file_name in result.written:
                log.info(
                    "CDI spec %s written: %d devices",
                    directory / spec.file_name,
                    len(spec.document["devices"]),
                )
        for name in result.removed:
            log.info("CDI spec %s removed: no longer needed", directory / name)
        return None

    def _in_use(self) -> frozenset[str] | None:
        if self._checkpoint is None:
            return frozenset()
        try:
            names = names_in_use(self._checkpoint)
        except CdiError as exc:
            self._failures.report(
                "checkpoint",
                f"CDI: {exc}; keeping every CDI name defined before, since admitted containers may name it",
            )
            return None
        self._failures.clear("checkpoint")
        return names

    def _report_kept(self, kept: tuple[str, ...]) -> None:
        if kept and kept != self.kept:
            log.info(
                "CDI: %d names the config no longer serves stay defined while admitted containers hold "
                "them (kubelet replays them on restarts): %s",
                len(kept),
                ", ".join(sorted(kept)),
            )
        elif self.kept and not kept:
            log.info("CDI: no admitted container holds a name the config no longer serves")
        self.kept = kept
