"""One version: the package (`--version`), the chart (version, appVersion), the image (the Makefile's tag and
label), the kustomize image component, the documented ClusterPolicy, and a CHANGELOG entry. And `make
release`: what its script makes, and its Python steps (image/release.py: the chart package, the SBOM, the
SHA256SUMS)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from gpu_operator import cluster_policy_in

from nvidia_device_plugin import __version__

from support.checks import assert_all
from support.waiting import scaled

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deployments" / "helm" / "nvidia-device-plugin"


def test_the_chart_is_this_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == chart["appVersion"] == __version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["image"]["tag"] == "", "the image tag defaults to appVersion"


def test_the_command_says_this_version() -> None:
    for command in ("nvidia-device-plugin", "config-manager"):
        assert (Path(sys.executable).parent / command).exists()
    done = subprocess.run(
        [str(Path(sys.executable).parent / "nvidia-device-plugin"), "--version"],
        capture_output=True,
        text=True,
        timeout=scaled(60),
        check=True,
    )
    assert done.stdout.strip() == f"nvidia-device-plugin {__version__}"


def test_the_image_is_tagged_and_labelled_with_this_version() -> None:
    makefile = (ROOT / "Makefile").read_text()
    [version_line] = [line for line in makefile.splitlines() if line.startswith("VERSION = ")]
    assert "nvidia_device_plugin/__init__.py" in version_line, "the image version comes from the package"
    assert "--build-arg VERSION=$(VERSION)" in makefile and "-t $(IMAGE):$(VERSION)" in makefile
    assert 'org.opencontainers.image.version="${VERSION}"' in (ROOT / "Dockerfile").read_text()
    assert "version=$(sed -n" in (ROOT / "image" / "image-test.sh").read_text()


def test_the_static_manifests_and_the_operator_example_name_this_version() -> None:
    component = yaml.safe_load((ROOT / "manifests" / "image" / "kustomization.yaml").read_text())
    assert [entry["newTag"] for entry in component["images"]] == [__version__]
    policy = cluster_policy_in(ROOT / "docs" / "operations.md")
    assert policy["spec"]["devicePlugin"]["version"] == __version__


def test_the_changelog_has_an_entry_for_this_version() -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    headings = re.findall(r"^## (\S+)", changelog, re.MULTILINE)
    assert headings and headings[0] == __version__, f"the newest CHANGELOG entry is {headings[:1]}"


def _release_module() -> ModuleType:
    """image/release.py, the Python steps of `make release` (image/ is no package)."""
    spec = importlib.util.spec_from_file_location("release_steps", ROOT / "image" / "release.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _make_target(name: str) -> str:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(rf"^{re.escape(name)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, f"the Makefile has no {name} target"
    return target.group(1)


def test_make_release_writes_the_chart_the_image_archives_the_sboms_and_the_sums() -> None:
    assert "image/release.sh" in _make_target("release")
    script = (ROOT / "image" / "release.sh").read_text()
    for artifact in (
        'image/release.py chart deployments/helm/nvidia-device-plugin "$DIST"',
        "for arch in amd64 arm64; do",
        '"oci-archive:$archive:$IMAGE:$version"',
        "archive=$DIST/$NAME-$version-linux-$arch.oci.tar",
        'image/release.py sbom "$rootfs" "$DIST/$NAME-$version-linux-$arch.cdx.json"',
        'image/release.py sums "$DIST"',
    ):
        assert artifact in script, f"image/release.sh does not make {artifact}"
    assert "image/build-image.sh" in script, "the release builds the image as `make image-test` does"
    assert "/proc/sys/fs/binfmt_misc/qemu-$cpu" in script and "SKIPPED linux/$arch" in script


def test_sums_cover_every_file_and_sha256sum_checks_them(tmp_path: Path) -> None:
    release = _release_module()
    (tmp_path / "b.oci.tar").write_bytes(b"\0" * 3_000_000)
    (tmp_path / "a.tgz").write_bytes(b"chart")
    (tmp_path / "SHA256SUMS").write_text("stale\n")
    assert release.main(["sums", str(tmp_path)]) == 0
    lines = (tmp_path / "SHA256SUMS").read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == ["a.tgz", "b.oci.tar"], "sorted, itself left out"
    assert lines[0].split()[0] == hashlib.sha256(b"chart").hexdigest()
    if shutil.which("sha256sum"):
        subprocess.run(
            ["sha256sum", "--check", "--quiet", "SHA256SUMS"], cwd=tmp_path, check=True, timeout=scaled(60)
        )


def test_sums_refuse_an_empty_dist_or_a_directory_in_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = _release_module()
    assert release.main(["sums", str(tmp_path)]) == 1
    (tmp_path / "chart.tgz").write_bytes(b"x")
    (tmp_path / "stray").mkdir()
    assert release.main(["sums", str(tmp_path)]) == 1
    assert "stray is not a regular file" in capsys.readouterr().err
    assert not (tmp_path / "SHA256SUMS").exists()


def _fake_rootfs(root: Path, names: dict[str, str]) -> Path:
    site = root / "opt" / "venv" / "lib" / "python3.11" / "site-packages"
    for name, version in names.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_the_sbom_lists_the_image_venv_and_nothing_of_this_one(tmp_path: Path) -> None:
    release = _release_module()
    rootfs = _fake_rootfs(tmp_path / "rootfs", {"nvidia-device-plugin": __version__, "PyYAML": "6.0.3"})
    output = tmp_path / "sbom.cdx.json"
    assert release.main(["sbom", str(rootfs), str(output)]) == 0
    sbom = json.loads(output.read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {(c["name"], c["version"]) for c in sbom["components"]}
    assert listed == {("nvidia-device-plugin", __version__), ("PyYAML", "6.0.3")}
    assert {c["purl"] for c in sbom["components"]} >= {"pkg:pypi/pyyaml@6.0.3"}


def test_the_sbom_refuses_a_rootfs_without_the_venv(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    release = _release_module()
    assert release.main(["sbom", str(tmp_path), str(tmp_path / "out.json")]) == 1
    assert "site-packages" in capsys.readouterr().err
    rootfs = _fake_rootfs(tmp_path / "other", {"PyYAML": "6.0.3"})
    assert release.main(["sbom", str(rootfs), str(tmp_path / "out.json")]) == 1
    assert "no nvidia-device-plugin in the SBOM" in capsys.readouterr().err


def test_the_chart_is_packaged_as_helm_lays_it_out(tmp_path: Path) -> None:
    release = _release_module()
    assert release.main(["chart", str(CHART), str(tmp_path)]) == 0
    archive = tmp_path / f"nvidia-device-plugin-{__version__}.tgz"
    with tarfile.open(archive) as packed:
        names = packed.getnames()
        chart = yaml.safe_load(packed.extractfile("nvidia-device-plugin/Chart.yaml").read())  # type: ignore[union-attr]
    assert_all(names, lambda name: name.startswith("nvidia-device-plugin/"))
    assert {"nvidia-device-plugin/values.yaml", "nvidia-device-plugin/templates/NOTES.txt"} <= set(names)
    assert chart["version"] == chart["appVersion"] == __version__
