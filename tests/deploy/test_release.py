"""One version: the package (`--version`), the chart (version, appVersion), the image (the Makefile's tag and
label), the kustomize image component, the documented ClusterPolicy, and a CHANGELOG entry."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml
from gpu_operator import cluster_policy_in

from nvidia_device_plugin import __version__

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
        timeout=60,
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
