"""The image's build files checked offline: the Dockerfile's stages and build arguments, the lock files
against pyproject.toml and the installed dependency closure, the build context, and the Makefile and image
test that build it. `make image-test` (tests/deploy/test_image.py) builds and runs the image itself.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from packaging.requirements import Requirement

from support.checks import assert_all

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
LOCK = ROOT / "image" / "requirements.lock"
BUILD_LOCK = ROOT / "image" / "build-requirements.lock"
BUILD_ONLY_ARGS = ("PIP_INDEX", "PIP_EXTRA_INDEX", "PIP_CA_BUNDLE")


def _instructions() -> list[str]:
    """Instructions of the Dockerfile, continuation lines joined and comments dropped."""
    lines = [line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")]
    return [i.strip() for i in re.sub(r"\\\n", " ", "\n".join(lines)).splitlines() if i.strip()]


def _stages() -> dict[str, list[str]]:
    stages: dict[str, list[str]] = {"": []}
    current = ""
    for instruction in _instructions():
        if instruction.startswith("FROM "):
            current = instruction.split()[-1]
            stages[current] = []
        stages[current].append(instruction)
    return stages


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#") and not line.lstrip().startswith("--hash="):
            name, _, version = line.removesuffix("\\").partition("==")
            assert version, f"{path.name}: {line!r} is not pinned with =="
            pins[_canonical(name)] = version.strip()
    return pins


def _hashes(path: Path) -> dict[str, list[str]]:
    """Each pin's `--hash=` values, as pip reads them (continuation lines joined)."""
    joined = re.sub(r"\\\n", " ", path.read_text())
    found = {}
    for line in joined.splitlines():
        if line.strip() and not line.startswith("#"):
            name = _canonical(line.split("==")[0])
            found[name] = re.findall(r"--hash=sha256:(\S+)", line)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_dockerfile_is_two_stages_on_one_base_argument_and_needs_no_buildkit() -> None:
    text = DOCKERFILE.read_text()
    assert not re.search(r"^#\s*syntax=", text, re.MULTILINE), "a syntax line makes the build pull a frontend"
    assert not any("--mount=" in i for i in _instructions()), "RUN --mount needs BuildKit"
    stages = _stages()
    assert list(stages) == ["", "builder", "runtime"], "expected a builder stage and a runtime stage"
    [default] = [m.group(1) for i in stages[""] if (m := re.fullmatch(r"ARG BASE_IMAGE=(\S+)", i))]
    name, _, tag = default.partition(":")
    assert name == "python" and re.fullmatch(r"3\.1[2-9](\.\d+)?-slim-bookworm(@sha256:[0-9a-f]{64})?", tag)
    for stage in ("builder", "runtime"):
        assert stages[stage][0] == f"FROM ${{BASE_IMAGE}} AS {stage}"
    assert "@sha256:" in text, "the pin-by-digest instruction is missing"
    digest = re.fullmatch(r"[^@]+@(sha256:[0-9a-f]{64})", default)
    assert digest, f"the default base {default} is not pinned by digest"
    [recorded] = [i for i in stages[""] if i.startswith("ARG BASE_DIGEST=")]
    assert recorded == f"ARG BASE_DIGEST={digest.group(1)}", "base.digest must name the default base's digest"
    assert f"# {name}:{tag.split('@')[0]} " in text, "the pinned tag is not named in a comment beside it"
    # Without re-declaring it inside the stage, ${BASE_IMAGE} is empty there and so is base.name.
    assert "ARG BASE_IMAGE" in stages["runtime"]


def test_index_and_ca_arguments_reach_the_builder_only() -> None:
    stages = _stages()
    for name in BUILD_ONLY_ARGS:
        assert f'ARG {name}=""' in stages["builder"], f"the builder does not take {name}"
        assert not any(name in i for i in stages["runtime"]), f"{name} must not reach the runtime stage"
    [build] = [i for i in stages["builder"] if i.startswith("RUN ")]
    assert "PIP_CERT=/tmp/ca.pem" in build and "rm -rf /tmp/wheels /tmp/ca.pem" in build


def test_runtime_takes_the_venv_and_nothing_of_the_build() -> None:
    runtime = _stages()["runtime"]
    copies = [i for i in runtime if i.startswith("COPY")]
    assert copies == ["COPY --from=builder /opt/venv /opt/venv", "COPY LICENSE /licenses/LICENSE"]
    # The one RUN of the runtime stage installs kmod for the GPU Operator's entrypoint (lsmod), no build tool.
    [run] = [i for i in runtime if i.startswith("RUN ")]
    assert "apt-get install -y -qq --no-install-recommends kmod" in run
    assert "rm -rf /var/lib/apt/lists/*" in run and "command -v lsmod" in run
    assert not re.search(r"\b(pip|python3?|gcc|make)\b", run), "the runtime stage runs no build tool"
    [build] = [i for i in _stages()["builder"] if i.startswith("RUN ")]
    assert "python3 -m venv --without-pip /opt/venv" in build, "pip must never be installed into /opt/venv"
    assert "--no-compile --no-deps" in build and "-r image/requirements.lock" in build
    assert "--require-hashes -r image/requirements.lock" in build
    assert "--require-hashes -r image/build-requirements.lock" in build
    assert "--no-index /tmp/wheels/nvidia_device_plugin-*.whl" in build
    assert "pip --python /opt/venv/bin/python check" in build
    assert "-name __pycache__ -prune -exec rm -rf {} +" in build
    assert "PYTHONDONTWRITEBYTECODE=1" in " ".join(runtime)


def test_entrypoint_cmd_and_labels() -> None:
    instructions = _instructions()
    assert 'ENTRYPOINT ["nvidia-device-plugin"]' in instructions
    assert 'CMD ["run"]' in instructions
    labels = " ".join(i for i in instructions if i.startswith("LABEL "))
    keys = ("title", "description", "version", "revision", "source", "vendor", "licenses", "base.name")
    for key in (*keys, "base.digest"):
        assert f"org.opencontainers.image.{key}=" in labels
    # The labels OpenShift reads, as NVIDIA's image carries them.
    openshift = ("name", "vendor", "version", "release", "summary", "description", "maintainer")
    for key in (*openshift, "io.k8s.display-name", "io.k8s.description"):
        assert re.search(rf'(^|\s){re.escape(key)}="[^"]+"', labels), f"no {key} label"
    assert 'version="${VERSION}"' in labels
    assert 'org.opencontainers.image.base.name="${BASE_IMAGE}"' in labels
    license_text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in license_text and "Version 2.0" in license_text


def _closure(distribution: str) -> dict[str, str]:
    """Every distribution `distribution` needs at run time (no extras), with its installed version."""
    found: dict[str, str] = {}
    todo = [distribution]
    while todo:
        name = todo.pop()
        for text in importlib.metadata.requires(name) or []:
            requirement = Requirement(text)
            if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
                continue
            key = _canonical(requirement.name)
            if key not in found:
                found[key] = importlib.metadata.version(requirement.name)
                todo.append(requirement.name)
    return found


def test_the_lock_pins_the_whole_dependency_closure_at_the_installed_versions() -> None:
    locked = _pins(LOCK)
    closure = _closure("nvidia-device-plugin")
    assert set(locked) == set(closure), (
        f"image/requirements.lock lacks {sorted(set(closure) - set(locked))}, "
        f"has extra {sorted(set(locked) - set(closure))}"
    )
    assert locked == closure, "image/requirements.lock and the installed closure differ in versions"


def test_the_lock_agrees_with_pyproject() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.MULTILINE | re.DOTALL)
    assert block
    direct = [Requirement(d) for d in re.findall(r'"([^"]+)"', block.group(1))]
    locked = _pins(LOCK)
    for requirement in direct:
        assert requirement.specifier.contains(locked[_canonical(requirement.name)]), str(requirement)


def test_every_pin_has_a_sha256_for_pip_require_hashes() -> None:
    for lock in (LOCK, BUILD_LOCK):
        hashes = _hashes(lock)
        assert set(hashes) == set(_pins(lock)), f"{lock.name}: a line is neither a comment nor a pin"
        for name, found in hashes.items():
            assert found, f"{lock.name}: {name} has no --hash (pip --require-hashes refuses it)"
            assert_all(found, lambda h: re.fullmatch(r"[0-9a-f]{64}", h), f"{lock.name}: {name}")


def test_the_build_tools_are_pinned_and_satisfy_the_build_system() -> None:
    tools = _pins(BUILD_LOCK)
    # packaging is wheel's dependency: pip --require-hashes needs the tools' whole closure pinned.
    assert set(tools) == {"pip", "setuptools", "wheel", "packaging"}
    assert tuple(int(p) for p in tools["pip"].split(".")[:2]) >= (22, 3), "pip --python needs pip >= 22.3"
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r"^requires = \[(.*?)\]", pyproject, re.MULTILINE)
    assert requires
    for text in re.findall(r'"([^"]+)"', requires.group(1)):
        requirement = Requirement(text)
        assert requirement.specifier.contains(tools[_canonical(requirement.name)]), text


def test_dockerignore_keeps_local_state_out_and_the_locks_in() -> None:
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    ignored = {line for line in lines if line and not line.startswith("#")}
    assert {".git", ".venv", "tests", "deployments", "image/*", "!image/*.lock"} <= ignored
    for needed in ("pyproject.toml", "setup.cfg", "README.md", "LICENSE", "nvidia_device_plugin"):
        assert needed not in ignored
    copied = {c.split()[1] for c in _instructions() if c.startswith("COPY image/")}
    assert copied == {"image/build-requirements.lock"}


def test_console_scripts_the_image_and_the_operator_use() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert 'config-manager = "nvidia_device_plugin.cli.config_manager:main"' in pyproject
    assert 'gpu-feature-discovery = "nvidia_device_plugin.cli.gfd:main"' in pyproject
    assert (Path(sys.executable).parent / "config-manager").exists()


def _make_target(name: str) -> str:
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(rf"^{re.escape(name)}:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE)
    assert target, f"the Makefile has no {name} target"
    return target.group(1)


def test_makefile_builds_the_image_the_chart_names() -> None:
    makefile = (ROOT / "Makefile").read_text()
    values = yaml.safe_load((ROOT / "deployments/helm/nvidia-device-plugin/values.yaml").read_text())
    assert re.search(rf"^IMAGE \?= {re.escape(values['image']['repository'])}$", makefile, re.MULTILINE)
    assert "docker build " in _make_target("image") and "-t $(IMAGE):" in _make_target("image")
    assert "docker buildx build --platform $(PLATFORMS)" in _make_target("image-multiarch")
    assert re.search(r"^PLATFORMS \?= linux/amd64,linux/arm64$", makefile, re.MULTILINE)
    assert "image/image-test.sh" in _make_target("image-test")
    ci = (ROOT / ".ci" / "run").read_text().strip()
    reuse = "make release REUSE_IMAGE=localhost/nvidia-device-plugin-py:image-test"
    assert ci.endswith(f"make test\nmake image-test\n{reuse}"), "CI: test, image-test, release"


def test_the_image_test_builds_without_cache_on_runc() -> None:
    script = (ROOT / "image" / "image-test.sh").read_text()
    builder = (ROOT / "image" / "build-image.sh").read_text()
    build = builder[builder.index("buildah bud") :]
    assert "--no-cache" in build.split("\n")[0], "buildah 1.28 reuses cached layers across changed build-args"
    assert "RUNTIME=runc" in script and "export RUNTIME" in script and '--runtime "$RUNTIME"' in build
    assert 'image/build-image.sh "$IMAGE_TAG"' in script
    assert '${arch:+--arch "$arch"}' in build and '--build-arg BASE_DIGEST="$base_digest"' in build
    assert "apt-get install" in script and "image/make-base.sh" in script
    for tool in ("podman", "buildah", "mmdebstrap", "runc"):
        assert tool in script.split("missing=()")[1].split("\n")[1]


def _hash_lock() -> ModuleType:
    """image/hash_lock.py, which writes the locks' hashes (image/ is no package)."""
    spec = importlib.util.spec_from_file_location("hash_lock", ROOT / "image" / "hash_lock.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_hash_lock_puts_each_pins_hashes_under_it_and_keeps_the_comments() -> None:
    hash_lock = _hash_lock()
    text = "# why\nPyYAML==6.0.3 \\\n    --hash=sha256:old\nidna==3.20\n"
    assert hash_lock.pins(text) == [("PyYAML", "6.0.3"), ("idna", "3.20")]
    written = hash_lock.rewrite(text, {"pyyaml": {"b" * 64, "a" * 64}, "idna": {"c" * 64}})
    assert written == (
        f"# why\nPyYAML==6.0.3 \\\n    --hash=sha256:{'a' * 64} \\\n    --hash=sha256:{'b' * 64}\n"
        f"idna==3.20 \\\n    --hash=sha256:{'c' * 64}\n"
    )
    assert hash_lock.rewrite(written, {"pyyaml": {"a" * 64, "b" * 64}, "idna": {"c" * 64}}) == written
    assert hash_lock._project_of("PyYAML-6.0.3-cp311-cp311-manylinux_2_17_x86_64.whl") == "pyyaml"
    with pytest.raises(SystemExit, match=r"no file downloaded for idna==3.20"):
        hash_lock.rewrite(text, {"pyyaml": {"a" * 64}})


def test_the_committed_locks_are_what_hash_lock_writes() -> None:
    hash_lock = _hash_lock()
    for lock in (LOCK, BUILD_LOCK):
        text = lock.read_text()
        assert hash_lock.rewrite(text, {n: set(h) for n, h in _hashes(lock).items()}) == text, lock.name
