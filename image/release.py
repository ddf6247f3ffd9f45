"""The Python steps of `make release` (image/release.sh runs them; `dist/` is what they write).

    python image/release.py chart CHART_DIR DIST        package the Helm chart (Helm's own packager)
    python image/release.py sbom ROOTFS OUTPUT          CycloneDX SBOM of an image's /opt/venv (cyclonedx-py)
    python image/release.py sums DIST                   SHA256SUMS over every other file in DIST

Each step fails with one line naming what is wrong (exit 1), never with a traceback for bad input.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

SUMS = "SHA256SUMS"
SBOM_LIMIT_S = 300
READ_CHUNK = 1 << 20


class ReleaseError(Exception):
    """A release step cannot be done; the message says why."""


def package_chart(chart: Path, dist: Path) -> Path:
    """`helm package CHART -d DIST`, through helm-sdkpy (Helm's Go library): the archive Helm itself makes,
    `<name>-<version>.tgz` with the chart under `<name>/`, `.helmignore` respected."""
    try:
        import helm_sdkpy as helm  # type: ignore[import-untyped]  # imported here: only `chart` needs Helm
    except ImportError as error:
        raise ReleaseError(f"no helm-sdkpy ({error}): needs Python >= 3.12, the test extras") from error

    if not (chart / "Chart.yaml").is_file():
        raise ReleaseError(f"{chart} is not a chart: no Chart.yaml")
    dist.mkdir(parents=True, exist_ok=True)
    try:
        made = asyncio.run(helm.Package(helm.Configuration()).run(str(chart), dest_dir=str(dist)))
    except helm.HelmError as error:
        raise ReleaseError(f"helm package {chart}: {error}") from error
    return Path(made)


def site_packages(rootfs: Path) -> Path:
    """The one site-packages of the image's venv, /opt/venv, under a mounted root filesystem."""
    found = sorted(rootfs.glob("opt/venv/lib/python3*/site-packages"))
    if len(found) != 1:
        raise ReleaseError(f"expected one opt/venv/lib/python3.*/site-packages under {rootfs}, found {found}")
    return found[0]


def write_sbom(rootfs: Path, output: Path) -> None:
    """cyclonedx-py's `environment` SBOM of the image's venv. cyclonedx-py asks the interpreter it is given
    for sys.path; the image's interpreter cannot run here (another architecture, another libc), so it is
    given a stand-in that answers with the mounted site-packages, which is all of the venv's sys.path that
    holds distributions. Everything else (reading the metadata, writing the SBOM) is cyclonedx-py's."""
    site = site_packages(rootfs)
    with tempfile.TemporaryDirectory() as work:
        python = Path(work) / "bin" / "python"
        python.parent.mkdir()
        answer = shlex.quote(json.dumps([str(site)]))
        python.write_text(f"#!/bin/sh\nprintf '%s' {answer}\n")
        python.chmod(0o755)
        command = [str(Path(sys.executable).parent / "cyclonedx-py"), "environment", "--output-reproducible"]
        command += ["--mc-type", "application", "--of", "JSON", "-o", str(output), work]
        done = subprocess.run(command, capture_output=True, text=True, timeout=SBOM_LIMIT_S, check=False)
    if done.returncode != 0:
        raise ReleaseError(f"cyclonedx-py failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    components = json.loads(output.read_text()).get("components", [])
    if not any(c.get("name") == "nvidia-device-plugin" for c in components):
        raise ReleaseError(f"{output}: no nvidia-device-plugin in the SBOM; is {site} the image's venv?")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_sums(dist: Path) -> Path:
    """SHA256SUMS in `sha256sum -c` format: every regular file of DIST but itself, sorted by name."""
    files = sorted(p for p in dist.iterdir() if p.name != SUMS)
    if not files:
        raise ReleaseError(f"{dist} has nothing to sum")
    for path in files:
        if not path.is_file() or path.is_symlink():
            raise ReleaseError(f"{path} is not a regular file: dist/ holds only the release's files")
    sums = dist / SUMS
    sums.write_text("".join(f"{sha256_of(p)}  {p.name}\n" for p in files))
    return sums


USAGE = __doc__ or ""


def main(argv: list[str]) -> int:
    try:
        match argv:
            case ["chart", chart, dist]:
                print(package_chart(Path(chart), Path(dist)))
            case ["sbom", rootfs, output]:
                write_sbom(Path(rootfs), Path(output))
                print(output)
            case ["sums", dist]:
                print(write_sums(Path(dist)))
            case _:
                print(USAGE, file=sys.stderr)
                return 2
    except (ReleaseError, OSError) as error:
        print(f"release: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
