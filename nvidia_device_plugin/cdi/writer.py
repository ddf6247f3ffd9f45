"""Putting CDI specs into the spec directory, and keeping only the ones the daemon still needs.

A spec is written to a temporary file in the same directory and renamed over the old one, so a runtime
never reads half a spec; files are 0644 (runtimes read them as another user). Ours are the files named
`k8s.device-plugin.nvidia.com-<class>.json` (and our temporary files): any of them not in the current set
is removed after the new ones are in place, so no spec names a device the node no longer has.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from nvidia_device_plugin.atomicfile import replace_file
from nvidia_device_plugin.boundedio import read_text
from nvidia_device_plugin.cdi.model import CDI_VENDOR, CdiError, CdiPlan, CdiSpec
from nvidia_device_plugin.logs import FailureLog

log = logging.getLogger(__name__)

SPEC_FILE_MODE = 0o644
_OURS_PREFIX = f"{CDI_VENDOR}-"
_TEMP_PREFIX = f".{CDI_VENDOR}-"
_PROBLEM = "problem"  # the FailureLog key of why nothing can be served


@dataclass(frozen=True)
class WriteResult:
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
    """Keeps the spec directory in step with the served snapshot; logs once per state change.

    `publish` returns None when every CDI name Allocate can return is defined by a written spec, else why
    not; the daemon then serves no resource (Allocate would answer names no runtime can resolve).
    """

    def __init__(self) -> None:
        self.problem: str | None = None
        self._dirs: set[Path] = set()  # where this process wrote specs: cleaned when no longer needed
        self._failures = FailureLog(log)

    def publish(self, plan: CdiPlan | None) -> str | None:
        if plan is None:  # no CDI strategy: our specs from earlier in this process are not needed
            self._clean(self._dirs)
            self._set_problem(None)
            return None
        for note in plan.notes:  # each logged once in the process's life
            self._failures.report(f"note {note}", f"CDI: {note}")
        spec_dir = Path(plan.spec_dir)
        self._clean(self._dirs - {spec_dir})
        problem = plan.problem
        if problem is None:
            try:
                result = write_specs(spec_dir, plan.specs)
            except CdiError as exc:
                problem = f"cannot write the CDI spec: {exc}"
            else:
                self._dirs.add(spec_dir)
                for name in result.written:
                    spec = next(s for s in plan.specs if s.file_name == name)
                    log.info(
                        "CDI spec %s written: %d devices", spec_dir / name, len(spec.document["devices"])
                    )
                for name in result.removed:
                    log.info("CDI spec %s removed: no longer needed", spec_dir / name)
        if problem is not None:
            # Never leave a spec that may name devices the node lacks.
            self._clean({spec_dir, *self._dirs})
        self._set_problem(problem)
        return problem

    def _clean(self, dirs: set[Path]) -> None:
        for directory in sorted(dirs):
            try:
                removed = remove_specs(directory)
            except CdiError as exc:
                log.error("CDI: %s", exc)
                continue
            self._dirs.discard(directory)
            for name in removed:
                log.info("CDI spec %s removed: no longer needed", directory / name)

    def _set_problem(self, problem: str | None) -> None:
        if problem is not None:
            self._failures.report(
                _PROBLEM,
                f"{problem}; serving no resources until it is fixed (then SIGHUP or a config change)",
                logging.ERROR,
            )
        elif self._failures.clear(_PROBLEM):
            log.info("CDI specs can be generated again; serving resources")
        self.problem = problem
