"""Add `--hash=sha256:` lines to a pinned requirements file, for every platform the image is built for.

    python image/hash_lock.py image/requirements.lock [image/build-requirements.lock ...]

Each file keeps its comments and its `name==version` pins; each pin gains the sha256 of every file pip would
pick for it on linux/amd64 and linux/arm64 (glibc 2.36) under CPython 3.11, 3.12 and 3.13 (the bases the
Dockerfile supports), so `pip install --require-hashes` accepts it on each and accepts nothing else. The files
come from `pip download` against this machine's index configuration (pip.conf, PIP_INDEX_URL, ...): the hashes
are those of what the index serves. Run it after changing a pin, and review the diff.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

# glibc 2.36: Debian bookworm's (python:3.12-slim-bookworm, the local base), so every manylinux tag up to
# 2.36, in pip's order of preference (newest first), each architecture on its own.
PLATFORMS = tuple(
    (*(f"manylinux_2_{minor}_{arch}" for minor in range(36, 16, -1)), f"manylinux2014_{arch}")
    for arch in ("x86_64", "aarch64")
)
PYTHONS = ("3.11", "3.12", "3.13")
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
DOWNLOAD_LIMIT_S = 900


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> list[tuple[str, str]]:
    """The `name==version` pins of a requirements file, in order; hash lines and comments are skipped."""
    found = []
    for line in text.splitlines():
        match = PIN.match(line.strip())
        if match:
            found.append((match.group(1), match.group(2)))
    return found


def rewrite(text: str, hashes: dict[str, set[str]]) -> str:
    """The file with each pin followed by its hashes (sorted), and any old hash lines dropped."""
    out: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("--hash="):
            continue
        match = PIN.match(stripped)
        if not match:
            out.append(line)
            continue
        name, version = match.group(1), match.group(2)
        found = sorted(hashes.get(canonical(name), set()))
        if not found:
            raise SystemExit(f"no file downloaded for {name}=={version}: the index does not serve it")
        out.append(f"{name}=={version} \\")
        lines = [f"    --hash=sha256:{digest}" for digest in found]
        out.extend(line + " \\" for line in lines[:-1])
        out.append(lines[-1])
    return "\n".join(out) + "\n"


def _project_of(filename: str) -> str:
    """The project name of a wheel or sdist file name (`grpcio-1.85.3-cp311-...whl` -> `grpcio`)."""
    stem = filename.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
    return canonical(stem.split("-")[0])


def download(requirements: Path, into: Path) -> None:
    """Every file pip would install from `requirements` (no dependencies) on each platform and Python."""
    for platform in PLATFORMS:
        for python in PYTHONS:
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:"]
            command += [option for tag in platform for option in ("--platform", tag)]
            command += ["--python-version", python, "-d", str(into), "-r", str(requirements)]
            subprocess.run(command, check=True, timeout=DOWNLOAD_LIMIT_S)


def file_hashes(directory: Path) -> dict[str, set[str]]:
    hashes: dict[str, set[str]] = defaultdict(set)
    for path in sorted(directory.iterdir()):
        hashes[_project_of(path.name)].add(hashlib.sha256(path.read_bytes()).hexdigest())
    return hashes


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        path = Path(name)
        text = path.read_text()
        with tempfile.TemporaryDirectory() as work:
            plain = Path(work) / "pins.txt"
            plain.write_text("".join(f"{n}=={v}\n" for n, v in pins(text)))
            files = Path(work) / "files"
            files.mkdir()
            try:
                download(plain, files)
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
                print(f"{path}: left as it was: pip download failed ({error})", file=sys.stderr)
                return 1
            path.write_text(rewrite(text, file_hashes(files)))
        print(f"{path}: {len(pins(text))} pins hashed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
