"""The `plan` views: the human table and the JSON document, read back as a person or script would."""

from __future__ import annotations

import json

from nvidia_device_plugin.cli.planview import plan_to_json, render_plan_table
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.plans.resources import replica_id

from support.checks import assert_all
from support.inventories import (
    A100,
    GIB,
    GPU,
    T4,
    config,
    count,
    dgx_a100,
    entry,
    gpu_uuid,
    make_gpu,
    mig_mixed_a100,
    mig_uuid,
    node,
    refs,
    share,
    single_t4,
)

DEVICE_KEYS = {
    "id",
    "physical_uuid",
    "gpu_uuid",
    "gpu_index",
    "mig_index",
    "replica",
    "numa_node",
    "kind",
    "memory_bytes",
}
RESOURCE_KEYS = {
    "name",
    "socket",
    "sharing",
    "replicas",
    "fail_requests_greater_than_one",
    "device_count",
    "devices",
}
GPU_KEYS = {
    "index",
    "uuid",
    "name",
    "memory_bytes",
    "pci_bus_id",
    "numa_node",
    "mig_enabled",
    "mig_devices",
    "resources",
}


def table_rows(table: str) -> list[list[str]]:
    """Data rows (indented, below a column header), split into cells on runs of two or more spaces."""
    rows = []
    for line in table.splitlines():
        if line.startswith("  ") and not line.strip().startswith("ID "):
            rows.append([cell for cell in line.strip().split("  ") if cell])
    return [[cell.strip() for cell in row] for row in rows]


def test_table_for_a_time_sliced_dgx() -> None:
    inventory = dgx_a100()
    plans = build_resources(inventory, config(time_slicing=share(entry(replicas=4), fail=True)))
    table = render_plan_table(plans, inventory)
    lines = table.splitlines()
    assert lines[0] == (
        "nvidia.com/gpu: 32 devices on 8 physical, sharing=time-slicing replicas=4 max-request=1, "
        "socket=nvidia-gpu.sock"
    )
    assert lines[1].split() == ["ID", "DEVICE", "UUID", "MODEL", "MEMORY", "NUMA"]
    rows = table_rows(table)
    assert len(rows) == 32
    assert rows[0] == [replica_id(gpu_uuid(0), 0), "0", gpu_uuid(0), A100, "80.0 GiB", "0"]
    assert rows[-1] == [replica_id(gpu_uuid(7), 3), "7", gpu_uuid(7), A100, "80.0 GiB", "1"]
    assert_all(lines, lambda line: line == line.rstrip())
    assert table.endswith("\n")


def test_table_columns_line_up() -> None:
    inventory = mig_mixed_a100()
    plans = build_resources(inventory, config(mig="mixed", time_slicing=share(entry(GPU, replicas=2))))
    block = render_plan_table(plans, inventory).split("\n\n")[0].splitlines()
    header, rows = block[1], block[2:]
    for column in ("DEVICE", "UUID", "MODEL", "MEMORY", "NUMA"):
        start = header.index(column)
        assert_all(rows, lambda row, at=start: row[at - 2 : at] == "  " and row[at] != " ")


def test_table_shows_mig_profiles_and_unknown_numa() -> None:
    inventory = mig_mixed_a100()
    plans = build_resources(inventory, config(mig="mixed"))
    table = render_plan_table(plans, inventory)
    blocks = {block.splitlines()[0].split(":")[0]: block for block in table.strip().split("\n\n")}
    assert list(blocks) == [GPU, "nvidia.com/mig-1g.10gb", "nvidia.com/mig-2g.20gb", "nvidia.com/mig-3g.40gb"]
    assert blocks["nvidia.com/mig-1g.10gb"].splitlines()[0] == (
        "nvidia.com/mig-1g.10gb: 2 devices, sharing=none, socket=nvidia-mig-1g.10gb.sock"
    )
    assert table_rows(blocks["nvidia.com/mig-2g.20gb"]) == [
        [mig_uuid(0, 2), "0:2", mig_uuid(0, 2), f"{A100} MIG 2g.20gb", "20.0 GiB", "0"]
    ]
    t4 = single_t4()
    (row,) = table_rows(render_plan_table(build_resources(t4, config()), t4))
    assert row == [gpu_uuid(0), "0", gpu_uuid(0), T4, "16.0 GiB", "-"]


def test_table_with_nothing_to_advertise() -> None:
    assert "No resources to advertise" in render_plan_table((), node())


def test_json_document_keys_and_values() -> None:
    inventory = mig_mixed_a100()
    cfg = config(
        mig="mixed",
        time_slicing=share(entry("nvidia.com/mig-3g.40gb", replicas=2, devices=refs("1:0"))),
    )
    document = plan_to_json(build_resources(inventory, cfg), inventory)
    assert json.loads(json.dumps(document)) == document
    assert set(document) == {"resources", "gpus"}
    resources = {r["name"]: r for r in document["resources"]}
    assert list(resources) == [
        GPU,
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    for resource in document["resources"]:
        assert set(resource) == RESOURCE_KEYS
        assert resource["device_count"] == len(resource["devices"])
        assert_all(resource["devices"], lambda dev: set(dev) == DEVICE_KEYS)
    big = resources["nvidia.com/mig-3g.40gb"]
    assert (big["socket"], big["sharing"], big["replicas"]) == ("nvidia-mig-3g.40gb.sock", "time-slicing", 2)
    assert big["devices"][1] == {
        "id": replica_id(mig_uuid(1, 0), 0),
        "physical_uuid": mig_uuid(1, 0),
        "gpu_uuid": gpu_uuid(1),
        "gpu_index": 1,
        "mig_index": 0,
        "replica": 0,
        "numa_node": 0,
        "kind": "mig",
        "memory_bytes": 40 * GIB,
    }
    whole = resources[GPU]["devices"][0]
    assert (whole["kind"], whole["mig_index"], whole["replica"], whole["numa_node"]) == ("gpu", None, None, 1)

    gpus = document["gpus"]
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert_all(gpus, lambda g: set(g) == GPU_KEYS)
    assert gpus[0]["resources"] == [
        "nvidia.com/mig-1g.10gb",
        "nvidia.com/mig-2g.20gb",
        "nvidia.com/mig-3g.40gb",
    ]
    assert gpus[1]["resources"] == ["nvidia.com/mig-3g.40gb"]
    assert gpus[2]["resources"] == [GPU]
    assert gpus[0]["mig_devices"][2] == {
        "index": 2,
        "uuid": mig_uuid(0, 2),
        "profile": "2g.20gb",
        "memory_bytes": 20 * GIB,
    }
    assert (gpus[2]["mig_enabled"], gpus[2]["mig_devices"], gpus[2]["pci_bus_id"]) == (
        False,
        [],
        "00000000:09:00.0",
    )


def test_json_lists_gpus_that_are_not_advertised() -> None:
    inventory = node(make_gpu(0), make_gpu(1, mig=["1g.10gb"]))
    # Under `single` that node is an error, so show it under `mixed` with only GPU 1 shared.
    plans = build_resources(
        inventory, config(mig="mixed", time_slicing=share(entry("nvidia.com/mig-1g.10gb")))
    )
    gpus = plan_to_json(plans, inventory)["gpus"]
    assert [g["resources"] for g in gpus] == [[GPU], ["nvidia.com/mig-1g.10gb"]]
    assert plan_to_json((), inventory)["gpus"][0]["resources"] == []


def test_a_large_plan_renders_every_device() -> None:
    """8 GPUs x 7 MIG devices x 100 replicas: every one of the 5,600 IDs is in both views."""
    inventory = node(*(make_gpu(i, numa=i // 4, mig=["1g.10gb"] * 7) for i in range(8)))
    plans = build_resources(inventory, config(mig="single", time_slicing=share(entry(replicas=100))))
    (plan,) = plans
    assert len(plan.devices) == 5600
    table = render_plan_table(plans, inventory)
    assert len(table_rows(table)) == 5600
    assert table.splitlines()[0].startswith("nvidia.com/gpu: 5600 devices on 56 physical")
    document = plan_to_json(plans, inventory)
    assert document["resources"][0]["device_count"] == 5600
    assert len({dev["id"] for dev in document["resources"][0]["devices"]}) == 5600


def test_a_partly_shared_resource_shows_both_kinds_of_rows() -> None:
    inventory = dgx_a100()
    plans = build_resources(inventory, config(time_slicing=share(entry(replicas=2, devices=count(1)))))
    rows = table_rows(render_plan_table(plans, inventory))
    assert [row[0] for row in rows[:3]] == [
        replica_id(gpu_uuid(0), 0),
        replica_id(gpu_uuid(0), 1),
        gpu_uuid(1),
    ]
