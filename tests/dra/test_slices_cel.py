"""The CEL selectors of the generated DeviceClasses and of docs/dra.md, evaluated against the devices a
node publishes, with cel-python and the two Kubernetes CEL extensions they use (semver, quantity)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import celpy
import pytest
from celpy import celtypes

from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.dra.dryrun import DryRun, dry_run
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.snapshot import build_snapshot

from support.checks import assert_all

DOCS = Path(__file__).resolve().parents[2] / "docs" / "dra.md"
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei)?$")
_SCALE = {None: 1, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


class Semver(celtypes.StringType):
    """A `version` attribute, as Kubernetes' CEL semver library compares it."""

    def key(self) -> tuple[int, ...]:
        return tuple(int(p) for p in str(self).split("."))


class Quantity(celtypes.IntType):
    """A capacity, as Kubernetes' CEL quantity library compares it (integers only here)."""


def _quantity(text: Any) -> Quantity:
    match = _QUANTITY.match(str(text))
    assert match, f"not a quantity this test reads: {text}"
    return Quantity(int(match[1]) * _SCALE[match[2]])


def _compare(a: Any, b: Any) -> celtypes.IntType:
    ka, kb = (a.key(), b.key()) if isinstance(a, Semver) else (int(a), int(b))
    return celtypes.IntType((ka > kb) - (ka < kb))


FUNCTIONS = {
    "semver": lambda s: Semver(str(s)),
    "quantity": _quantity,
    "isGreaterThan": lambda a, b: celtypes.BoolType(_compare(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_compare(a, b) < 0),
    "compareTo": _compare,
}


def _cel_device(device: dict[str, Any], driver: str = "gpu.nvidia.com") -> Any:
    """The `device` variable of a DRA selector: driver, attributes and capacity by domain."""
    attributes: dict[str, dict[str, Any]] = {}
    for name, value in device["attributes"].items():
        domain, _, short = name.rpartition("/")
        ((kind, item),) = value.items()
        cel = {"version": Semver, "int": celtypes.IntType, "bool": celtypes.BoolType}.get(
            kind, celtypes.StringType
        )
        attributes.setdefault(domain or driver, {})[short] = cel(item)
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in device.get("capacity", {}).items():
        domain, _, short = name.rpartition("/")
        capacity.setdefault(domain or driver, {})[short] = _quantity(value["value"])

    def mapping(values: dict[str, dict[str, Any]]) -> celtypes.MapType:
        return celtypes.MapType(
            {
                celtypes.StringType(d): celtypes.MapType({celtypes.StringType(k): v for k, v in m.items()})
                for d, m in values.items()
            }
        )

    return celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("attributes"): mapping(attributes),
            celtypes.StringType("capacity"): mapping(capacity),
        }
    )


def selected(expression: str, devices: list[dict[str, Any]]) -> list[str]:
    env = celpy.Environment()
    program = env.program(env.compile(expression), functions=FUNCTIONS)
    names = []
    for device in devices:
        result = program.evaluate({"device": _cel_device(device)})
        assert isinstance(result, celtypes.BoolType), f"{expression} on {device['name']}: {result!r}"
        if result:
            names.append(device["name"])
    return names


@functools.cache  # each plan materializes a simulated node (about a second); the tests only read it
def plan(preset: str, text: str) -> DryRun:
    session = open_nvml(preset)
    try:
        return dry_run(build_snapshot(session, parse_config_text(text + "dra: {enabled: true}\n")), "n")
    finally:
        session.close()


def _devices(result: DryRun) -> list[dict[str, Any]]:
    return [d for s in result.slices for d in s["spec"]["devices"]]


def _class_expression(result: DryRun, name: str) -> str:
    (cls,) = [c for c in result.classes if c["metadata"]["name"] == name]
    return str(cls["spec"]["selectors"][0]["cel"]["expression"])


def test_the_generated_classes_select_exactly_their_devices() -> None:
    mixed = plan("a100-mig-mixed", "flags: {migStrategy: mixed}\n")
    devices = _devices(mixed)
    assert selected(_class_expression(mixed, "gpu.nvidia.com"), devices) == ["gpu-3"]
    migs = selected(_class_expression(mixed, "mig.nvidia.com"), devices)
    assert len(migs) == 13 and all("-mig-" in n for n in migs)
    assert selected(_class_expression(mixed, "mig-3g.40gb.nvidia.com"), devices) == [
        "gpu-1-mig-3g40gb-9-4",
        "gpu-2-mig-3g40gb-9-0",
        "gpu-2-mig-3g40gb-9-4",
    ]
    shared = plan(
        "dgx-a100",
        "sharing: {timeSlicing: {renameByDefault: true, resources: [{name: nvidia.com/gpu, replicas: 2}]}}\n",
    )
    assert len(selected(_class_expression(shared, "gpu.shared.nvidia.com"), _devices(shared))) == 8
    # NVIDIA's class selects time-sliced GPUs too (a whole-GPU claim asks for all their shares)
    assert len(selected(_class_expression(shared, "gpu.nvidia.com"), _devices(shared))) == 8


def _doc_expressions() -> list[str]:
    return re.findall(r"expression: '([^']+)'", DOCS.read_text())


def test_docs_show_selectors() -> None:
    assert len(_doc_expressions()) >= 4


@pytest.mark.parametrize("expression", _doc_expressions())
def test_every_selector_in_the_docs_evaluates_on_our_devices_and_selects_some(expression: str) -> None:
    chosen = []
    for preset in ("dgx-a100", "a100-mig-mixed", "dgx-h100", "t4-single", "h200-mig"):
        chosen += selected(expression, _devices(plan(preset, "")))
    assert chosen, f"{expression} selects no device on any preset"


def test_the_docs_selectors_mean_what_their_comments_say() -> None:
    newer, hopper, a100_mig, numa0 = _doc_expressions()[:4]
    t4 = _devices(plan("t4-single", ""))
    assert selected(newer, t4) == []  # 15 GiB
    assert (
        selected(hopper, _devices(plan("dgx-h100", "")))
        and selected(hopper, _devices(plan("dgx-a100", ""))) == []
    )
    assert_all(selected(a100_mig, _devices(plan("a100-mig-mixed", ""))), lambda n: "-mig-" in n)
    assert selected(numa0, _devices(plan("dgx-a100", ""))) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
