"""What a node publishes for dynamic MIG (`dra.dynamicMig`): one counter set per GPU in MIG mode, one device
per possible placement consuming exactly its memory slices, existing MIG devices as the placements they
occupy; every object valid at Kubernetes 1.34-1.37 and under the API server's counter rules (1.35 on); and,
fed to a small allocator that counts consumed counters, the placements fit as NVIDIA's table says.

The GPUs are hand-made with NVIDIA's published A100 placement tables (the MIG user guide's "A100 MIG
profiles" and `nvidia-smi mig -lgipp`), not read from NVML or the simulator."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

from nvidia_device_plugin.config.dra import Dra
from nvidia_device_plugin.config.flags import add_config_arguments, resolve_config
from nvidia_device_plugin.config.loader import parse_config_text
from nvidia_device_plugin.devices import Gpu, Inventory, MigAttributes, MigDevice, MigPlacementOption
from nvidia_device_plugin.dra.kinds.partition import whole_gpu_consumption
from nvidia_device_plugin.dra.ownership import DRA, wanted_owners
from nvidia_device_plugin.dra.slices import node_counter_sets, node_devices, planned_slices, slice_contents
from nvidia_device_plugin.dra.sync import plan_contents_sync
from nvidia_device_plugin.dra.taints import HealthTaints
from nvidia_device_plugin.events import CauseKind, HealthCause
from nvidia_device_plugin.health.registry import Verdict

from support.dra_rules import validate_objects
from support.inventories import make_gpu, mig_uuid, node

MIB = 1024**2
Json = dict[str, Any]

# (profile, GI profile ID, starts, size, memory MiB, (SMs, copy engines, decoders, encoders, JPEG, OFA))
A100_80GB = (
    ("1g.10gb", 19, range(7), 1, 9728, (14, 1, 0, 0, 0, 0)),
    ("1g.20gb", 15, (0, 2, 4, 6), 2, 19968, (14, 1, 1, 0, 0, 0)),
    ("2g.20gb", 14, (0, 2, 4), 2, 19968, (28, 2, 1, 0, 0, 0)),
    ("3g.40gb", 9, (0, 4), 4, 40192, (42, 3, 2, 0, 0, 0)),
    ("4g.40gb", 5, (0,), 4, 40192, (56, 4, 2, 0, 0, 0)),
    ("7g.80gb", 0, (0,), 8, 81152, (98, 7, 5, 0, 1, 1)),
)
A100_40GB = (
    ("1g.5gb", 19, range(7), 1, 4864, (14, 1, 0, 0, 0, 0)),
    ("1g.10gb", 15, (0, 2, 4, 6), 2, 9856, (14, 1, 1, 0, 0, 0)),
    ("2g.10gb", 14, (0, 2, 4), 2, 9856, (28, 2, 1, 0, 0, 0)),
    ("3g.20gb", 9, (0, 4), 4, 19968, (42, 3, 2, 0, 0, 0)),
    ("4g.20gb", 5, (0,), 4, 19968, (56, 4, 2, 0, 0, 0)),
    ("7g.40gb", 0, (0,), 8, 40192, (98, 7, 5, 0, 1, 1)),
)
TABLES = {"A100-SXM4-80GB": A100_80GB, "A100-SXM4-40GB": A100_40GB}


def _attributes(memory_mib: int, size: int, engines: tuple[int, ...]) -> MigAttributes:
    sms, copy, dec, enc, jpeg, ofa = engines
    return MigAttributes(memory_mib, sms, size, sms // 14, copy, dec, enc, jpeg, ofa)


def placements(table: Sequence[tuple[Any, ...]]) -> tuple[MigPlacementOption, ...]:
    return tuple(
        MigPlacementOption(
            profile, gi_id, start, size, mib * MIB, engines[0], _attributes(mib, size, engines)
        )
        for profile, gi_id, starts, size, mib, engines in table
        for start in starts
    )


def a100(index: int, model: str = "A100-SXM4-80GB", made: Sequence[tuple[str, int]] = ()) -> Gpu:
    """A100 `index` in MIG mode with its placement table; `made` lists MIG devices that exist already as
    (profile, placement start)."""
    table = TABLES[model]
    gpu = make_gpu(index, name=f"NVIDIA {model}", mig=[])
    rows = {row[0]: row for row in table}
    migs = tuple(
        MigDevice(
            uuid=mig_uuid(index, m),
            index=m,
            parent_uuid=gpu.uuid,
            parent_index=index,
            profile=profile,
            memory_bytes=rows[profile][4] * MIB,
            gpu_instance_id=m + 1,
            compute_instance_id=0,
            attributes=_attributes(rows[profile][4], rows[profile][3], rows[profile][5]),
            gi_profile_info_id=rows[profile][1],
            placement=(start, rows[profile][3]),
        )
        for m, (profile, start) in enumerate(made)
    )
    return replace(gpu, mig_devices=migs, mig_placements=placements(table), mig_memory_slices=8)


def publish(inventory: Inventory, dynamic: bool = True, owned: Sequence[int] | None = None) -> list[Json]:
    """The slices `dra plan` would write for `inventory`, DRA owning `owned` (GPU indices; all by default)."""
    uuids = {g.uuid for g in inventory.gpus if owned is None or g.index in owned}
    devices = node_devices(inventory, [], uuids, dynamic_mig=dynamic)
    return planned_slices("gpu-node-1", devices, node_counter_sets(inventory, uuids, dynamic))


def devices_of(slices: list[Json]) -> dict[str, Json]:
    return {d["name"]: d for s in slices for d in s["spec"].get("devices", [])}


def counter_sets_of(slices: list[Json]) -> dict[str, dict[str, str]]:
    return {
        cs["name"]: {name: c["value"] for name, c in cs["counters"].items()}
        for s in slices
        for cs in s["spec"].get("sharedCounters", [])
    }


def attribute(device: Json, name: str) -> object:
    (value,) = device["attributes"][name].values()
    return value


# --- the API server's counter rules (resource.k8s.io/v1 validation, 1.35 on) -------------------------------

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def check_counter_rules(slices: list[Json]) -> None:
    """sharedCounters and devices never in one slice; at most 8 counter sets a slice, 32 counters a set, 2
    consumptions a device, 32 counters a consumption; names DNS labels; a consumption names a counter
    set of the pool and counters that set has."""
    pool: dict[str, set[str]] = {}
    for s in slices:
        spec = s["spec"]
        assert not ("sharedCounters" in spec and "devices" in spec), "sharedCounters and devices in one slice"
        assert len(spec.get("sharedCounters", [])) <= 8
        for cs in spec.get("sharedCounters", []):
            assert _DNS_LABEL.fullmatch(cs["name"]) and len(cs["name"]) <= 63 and cs["name"] not in pool
            assert 1 <= len(cs["counters"]) <= 32
            assert all(_DNS_LABEL.fullmatch(n) and len(n) <= 63 for n in cs["counters"])
            pool[cs["name"]] = set(cs["counters"])
    for device in devices_of(slices).values():
        consumed = device.get("consumesCounters", [])
        assert len(consumed) <= 2
        for c in consumed:
            assert c["counterSet"] in pool, f"{device['name']} consumes an unknown set {c['counterSet']}"
            assert 1 <= len(c["counters"]) <= 32 and set(c["counters"]) <= pool[c["counterSet"]]


# --- a small allocator: what the scheduler does with counters, by exhaustive search ------------------------


def _number(value: str) -> int:
    units = {"Ki": 1024, "Mi": MIB, "Gi": 1024**3}
    suffix = value[-2:]
    return int(value[:-2]) * units[suffix] if suffix in units else int(value)


Request = Callable[[Json], bool]


def allocate(slices: list[Json], requests: Sequence[Request], extra: Sequence[Json] = ()) -> list[str] | None:
    """Device names meeting `requests` (one device each, none twice, counters never overdrawn), or None."""
    left = {
        (name, counter): _number(value)
        for name, counters in counter_sets_of(slices).items()
        for counter, value in counters.items()
    }
    devices = [*devices_of(slices).values(), *extra]

    def fits(device: Json, sign: int) -> bool:
        pairs = [(c["counterSet"], n, _number(v["value"])) for c in device.get("consumesCounters", [])
                 for n, v in c["counters"].items()]  # fmt: skip
        if sign > 0 and any(left[(s, n)] < v for s, n, v in pairs):
            return False
        for s, n, v in pairs:
            left[(s, n)] -= sign * v
        return True

    def search(i: int, chosen: list[int]) -> list[str] | None:
        if i == len(requests):
            return [devices[n]["name"] for n in chosen]
        # The same request again takes a later device: the order among equal requests does not matter.
        first = chosen[-1] + 1 if i and requests[i] is requests[i - 1] else 0
        for n in range(first, len(devices)):
            if n in chosen or not requests[i](devices[n]) or not fits(devices[n], 1):
                continue
            found = search(i + 1, [*chosen, n])
            fits(devices[n], -1)
            if found is not None:
                return found
        return None

    return search(0, [])


def first_fit(slices: list[Json], claims: Sequence[Request]) -> list[str] | None:
    """Claims allocated one after another, as the scheduler does for pods that come one by one: each gets
    the first published device it selects that still fits, and no claim is moved for a later one."""
    chosen: list[str] = []
    for claim in claims:
        taken = {name: d for name, d in devices_of(slices).items() if name in chosen}
        free = [d for name, d in devices_of(slices).items() if name not in chosen and claim(d)]
        found = next(
            (d["name"] for d in free if allocate(slices, [_named(n) for n in [*taken, d["name"]]])), None
        )
        if found is None:
            return None
        chosen.append(found)
    return chosen


def _named(name: str) -> Request:
    return lambda d: d["name"] == name


def profile(name: str) -> Request:
    return lambda d: d["attributes"].get("profile") == {"string": name}


def whole_gpu(d: Json) -> bool:
    return bool(d["attributes"]["type"] == {"string": "gpu"})


# --- the tests ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(TABLES))
def test_each_gpu_has_one_counter_set_the_whole_gpu(model: str) -> None:
    slices = publish(node(a100(0, model), a100(1, model)))
    sets = counter_sets_of(slices)
    assert list(sets) == ["gpu-0-counter-set", "gpu-1-counter-set"]
    seven = next(row for row in TABLES[model] if row[0].startswith("7g"))
    sms, copy, dec, enc, jpeg, ofa = seven[5]
    assert sets["gpu-0-counter-set"] == {
        "multiprocessors": str(sms),
        "copy-engines": str(copy),
        "decoders": str(dec),
        "encoders": str(enc),
        "jpeg-engines": str(jpeg),
        "ofa-engines": str(ofa),
        "memory": f"{seven[4]}Mi",
        **{f"memory-slice-{i}": "1" for i in range(8)},
    }
    assert slices[0]["spec"]["sharedCounters"] and "devices" not in slices[0]["spec"]  # counters first
    assert all(s["spec"]["pool"]["resourceSliceCount"] == len(slices) for s in slices)


@pytest.mark.parametrize("model", sorted(TABLES))
def test_one_device_per_placement_consuming_exactly_its_memory_slices(model: str) -> None:
    devices = devices_of(publish(node(a100(0, model), a100(1, model))))
    expected = {
        f"gpu-{g}-mig-{name.replace('.', '')}-{gi_id}-{start}": (name, gi_id, start, size, mib, engines)
        for g in (0, 1)
        for name, gi_id, starts, size, mib, engines in TABLES[model]
        for start in starts
    }
    assert set(devices) == set(expected) and len(devices) == 2 * 18
    for device_name, (name, _, start, size, mib, engines) in expected.items():
        device = devices[device_name]
        assert attribute(device, "type") == "mig" and attribute(device, "profile") == name
        assert "uuid" not in device["attributes"]  # not made yet
        assert attribute(device, "parentUUID") == make_gpu(int(device_name[4])).uuid
        ((consumed),) = device["consumesCounters"]
        assert consumed["counterSet"] == f"gpu-{device_name[4]}-counter-set"
        slices_taken = {n for n in consumed["counters"] if n.startswith("memory-slice-")}
        assert slices_taken == {f"memory-slice-{i}" for i in range(start, start + size)}
        assert consumed["counters"]["multiprocessors"] == {"value": str(engines[0])}
        assert consumed["counters"]["memory"] == {"value": f"{mib}Mi"}
        assert device["capacity"]["memory"] == {"value": f"{mib}Mi"}
        assert {n for n in device["capacity"] if n.startswith("memorySlice")} == {
            f"memorySlice{i}" for i in range(start, start + size)
        }


def test_every_object_is_valid_at_every_supported_version_and_under_the_counter_rules() -> None:
    for inventory in (
        node(a100(0), a100(1)),
        node(a100(0, "A100-SXM4-40GB"), make_gpu(1), a100(2, made=[("3g.40gb", 4)])),
        node(*(a100(i) for i in range(8))),  # 144 partitions: 64 a slice, 8 counter sets in one
        node(*(a100(i) for i in range(9))),  # 9 counter sets: two counter slices
    ):
        slices = publish(inventory)
        assert validate_objects(slices) == len(slices)
        check_counter_rules(slices)
    nine = publish(node(*(a100(i) for i in range(9))))
    assert [len(s["spec"].get("sharedCounters", [])) for s in nine[:2]] == [8, 1]


def test_the_placements_fit_as_nvidias_table_says() -> None:
    slices = publish(node(a100(0)))
    one, three, four, seven = profile("1g.10gb"), profile("3g.40gb"), profile("4g.40gb"), profile("7g.80gb")
    seven_small = allocate(slices, [one] * 7)
    assert seven_small is not None and len(set(seven_small)) == 7
    assert allocate(slices, [one] * 8) is None
    assert allocate(slices, [three, four]) == ["gpu-0-mig-3g40gb-9-4", "gpu-0-mig-4g40gb-5-0"]
    assert allocate(slices, [four, four]) is None
    assert allocate(slices, [three, three]) is not None
    assert allocate(slices, [seven]) == ["gpu-0-mig-7g80gb-0-0"]
    assert allocate(slices, [seven, one]) is None and allocate(slices, [one, seven]) is None
    assert allocate(slices, [profile("2g.20gb")] * 3 + [one]) is not None
    assert allocate(slices, [profile("2g.20gb")] * 3 + [profile("3g.40gb")]) is None


def test_claims_that_come_one_by_one_pack_from_the_last_slice_so_large_profiles_still_fit() -> None:
    slices = publish(node(a100(0)))
    one, three, four = profile("1g.10gb"), profile("3g.40gb"), profile("4g.40gb")
    assert first_fit(slices, [three, four]) == ["gpu-0-mig-3g40gb-9-4", "gpu-0-mig-4g40gb-5-0"]
    assert first_fit(slices, [one, four]) == ["gpu-0-mig-1g10gb-19-6", "gpu-0-mig-4g40gb-5-0"]
    assert first_fit(slices, [profile("2g.20gb"), four, one]) is not None
    sevens = first_fit(slices, [one] * 7)
    assert sevens == [f"gpu-0-mig-1g10gb-19-{start}" for start in range(6, -1, -1)]
    assert first_fit(slices, [one] * 8) is None and first_fit(slices, [four, four]) is None
    assert first_fit(slices, [one, profile("7g.80gb")]) is None


def test_two_gpus_hold_twice_as_much_and_a_whole_gpu_never_shares_one_with_a_partition() -> None:
    slices = publish(node(a100(0), a100(1)))
    assert allocate(slices, [profile("1g.10gb")] * 14) is not None
    assert allocate(slices, [profile("1g.10gb")] * 15) is None
    assert allocate(slices, [profile("7g.80gb")] * 2) is not None
    # No whole GPU is published for a GPU in MIG mode; were one published, it would consume every counter.
    assert not [d for d in devices_of(slices).values() if whole_gpu(d)]
    gpu = a100(0)
    whole: Json = {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}
    whole["consumesCounters"] = whole_gpu_consumption(gpu)
    assert allocate(slices, [whole_gpu], [whole]) == ["gpu-0"]
    for row in A100_80GB:
        assert allocate(slices, [whole_gpu, profile(row[0])], [whole]) is not None  # on GPU 1
        assert allocate(publish(node(gpu)), [whole_gpu, profile(row[0])], [whole]) is None


def test_a_gpu_not_in_mig_mode_stays_whole_beside_partitioned_ones() -> None:
    slices = publish(node(a100(0), make_gpu(1)))
    devices = devices_of(slices)
    assert "gpu-1" in devices and "consumesCounters" not in devices["gpu-1"]
    assert list(counter_sets_of(slices)) == ["gpu-0-counter-set"]
    assert allocate(slices, [whole_gpu, profile("7g.80gb")]) == ["gpu-1", "gpu-0-mig-7g80gb-0-0"]
    assert allocate(slices, [whole_gpu, whole_gpu]) is None


def test_existing_mig_devices_are_published_as_the_placements_they_occupy() -> None:
    gpu = a100(0, made=[("3g.40gb", 4), ("1g.10gb", 0)])
    devices = devices_of(publish(node(gpu)))
    made = devices["gpu-0-mig-3g40gb-9-4"]
    assert attribute(made, "uuid") == gpu.mig_devices[0].uuid
    assert attribute(devices["gpu-0-mig-1g10gb-19-0"], "uuid") == gpu.mig_devices[1].uuid
    slices_taken = {n for n in made["consumesCounters"][0]["counters"] if n.startswith("memory-slice-")}
    assert slices_taken == {"memory-slice-4", "memory-slice-5", "memory-slice-6", "memory-slice-7"}
    # Nothing that overlaps an existing device is published: its slices stay taken.
    assert set(devices) == {
        "gpu-0-mig-3g40gb-9-4",
        "gpu-0-mig-1g10gb-19-0",
        "gpu-0-mig-1g10gb-19-1",
        "gpu-0-mig-1g10gb-19-2",
        "gpu-0-mig-1g10gb-19-3",
        "gpu-0-mig-2g20gb-14-2",
        "gpu-0-mig-1g20gb-15-2",
    }
    slices = publish(node(gpu))
    assert allocate(slices, [profile("2g.20gb"), profile("3g.40gb"), profile("1g.10gb")]) is not None
    assert allocate(slices, [profile("4g.40gb")]) is None and allocate(slices, [profile("7g.80gb")]) is None


def test_a_gpu_with_an_unplaced_mig_device_keeps_the_static_kind() -> None:
    gpu = a100(0, made=[("2g.20gb", 0)])
    unplaced = replace(gpu, mig_devices=(replace(gpu.mig_devices[0], placement=None),))
    slices = publish(node(unplaced))
    assert counter_sets_of(slices) == {} and devices_of(slices) == {}  # its one device has no name either
    placed = publish(node(gpu), dynamic=False)  # dynamic MIG off: the static kind, as before
    assert list(devices_of(placed)) == ["gpu-0-mig-2g20gb-14-0"] and counter_sets_of(placed) == {}
    assert "consumesCounters" not in devices_of(placed)["gpu-0-mig-2g20gb-14-0"]


def test_off_by_default_nothing_changes() -> None:
    inventory = node(a100(0, made=[("3g.40gb", 4)]), make_gpu(1))
    uuids = {g.uuid for g in inventory.gpus}
    assert node_devices(inventory, [], uuids) == node_devices(inventory, [], uuids, dynamic_mig=False)
    assert node_counter_sets(inventory, uuids, False) == []
    assert publish(inventory, dynamic=False) == planned_slices(
        "gpu-node-1", node_devices(inventory, [], uuids)
    )


def test_only_dra_owned_gpus_publish_partitions_and_ownership_does_not_change() -> None:
    inventory = node(a100(0), a100(1))
    slices = publish(inventory, owned=[1])
    assert list(counter_sets_of(slices)) == ["gpu-1-counter-set"]
    assert {n.split("-mig-")[0] for n in devices_of(slices)} == {"gpu-1"}
    plain = Dra(enabled=True, gpus=("1",))
    assert wanted_owners(inventory, replace(plain, dynamic_mig=True)) == wanted_owners(inventory, plain)
    assert wanted_owners(inventory, plain)[inventory.gpus[1].uuid] == DRA


def test_a_republish_of_the_same_counters_and_placements_changes_nothing() -> None:
    slices = publish(node(*(a100(i) for i in range(3))))
    stored = [{**s, "metadata": {"name": f"s{n}", "uid": f"u{n}", "resourceVersion": "1"}} for n, s in
              enumerate(slices)]  # fmt: skip
    contents = [{k: v for k, v in s["spec"].items() if k in ("devices", "sharedCounters")} for s in slices]
    assert plan_contents_sync(stored, contents, "gpu-node-1", "uid").empty
    # One more GPU: its counter set and partitions are new slices, one generation up.
    bigger = node(*(a100(i) for i in range(4)))
    uuids = {g.uuid for g in bigger.gpus}
    wanted = slice_contents(
        node_devices(bigger, [], uuids, dynamic_mig=True), node_counter_sets(bigger, uuids, True)
    )
    plan = plan_contents_sync(stored, wanted, "gpu-node-1", "uid")
    assert plan.generation == 2 and not plan.empty


def test_the_config_key_flag_and_env() -> None:
    assert parse_config_text("dra: {enabled: true}").dra.dynamic_mig is False
    assert parse_config_text("dra: {enabled: true, dynamicMig: true}").dra.dynamic_mig is True
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    assert resolve_config(parser.parse_args(["--dra-dynamic-mig"]), {}).dra.dynamic_mig is True
    assert resolve_config(parser.parse_args([]), {"NVDP_DRA_DYNAMIC_MIG": "true"}).dra.dynamic_mig is True
    args = parser.parse_args(["--dra-dynamic-mig=false"])
    assert resolve_config(args, {"NVDP_DRA_DYNAMIC_MIG": "true"}).dra.dynamic_mig is False


def test_a_gpus_health_taint_lands_on_every_partition_of_it_and_on_its_made_devices() -> None:
    inventory = node(a100(0, made=[("3g.40gb", 4)]), a100(1))
    made = inventory.gpus[0].mig_devices[0]
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    verdicts = {
        inventory.gpus[1].uuid: Verdict(HealthCause(CauseKind.XID, "XID 79", 79), when),
        made.uuid: Verdict(HealthCause(CauseKind.XID, "XID 48", 48), when),
    }
    uuids = {g.uuid for g in inventory.gpus}
    devices = node_devices(inventory, [], uuids, HealthTaints(lambda: verdicts), dynamic_mig=True)
    tainted = {d["name"]: d["taints"][0]["value"] for d in devices if d.get("taints")}
    assert {n for n, xid in tainted.items() if xid == "79"} == {
        d["name"] for d in devices if d["name"].startswith("gpu-1-")
    }
    assert {n for n, xid in tainted.items() if xid == "48"} == {"gpu-0-mig-3g40gb-9-4"}
    slices = planned_slices("gpu-node-1", devices, node_counter_sets(inventory, uuids, True))
    assert validate_objects(slices) == len(slices)
    check_counter_rules(slices)


def test_an_existing_mig_device_nvml_lists_no_placement_for_stays_allocatable() -> None:
    made = a100(0, made=[("7g.80gb", 0)])
    gpu = replace(made, mig_placements=tuple(o for o in made.mig_placements if o.profile != "7g.80gb"))
    slices = publish(node(gpu))
    assert list(devices_of(slices)) == ["gpu-0-mig-7g80gb-0-0"]
    assert counter_sets_of(slices)["gpu-0-counter-set"]["multiprocessors"] == "98"
    assert allocate(slices, [profile("7g.80gb")]) == ["gpu-0-mig-7g80gb-0-0"]
