"""A simulated node brings its host tree, so Allocate's passDeviceSpecs reads it as on a real node."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from nvidia_device_plugin.config.v1 import Config, Flags
from nvidia_device_plugin.health.registry import UnhealthyIds
from nvidia_device_plugin.nvml.discovery import discover
from nvidia_device_plugin.nvml.host import REAL_HOST
from nvidia_device_plugin.nvml.session import open_nvml
from nvidia_device_plugin.plans.resource_plans import build_resources
from nvidia_device_plugin.serving.allocate import AllocationIndex, AllocationSettings, allocate

from support.checks import assert_all


def test_the_real_host_is_the_root_filesystem() -> None:
    assert (REAL_HOST.sysfs_root, REAL_HOST.proc_root, REAL_HOST.dev_root) == (
        Path("/sys"),
        Path("/proc"),
        Path("/"),
    )


def test_pass_device_specs_allocates_a_mig_device_on_the_simulated_host() -> None:
    with open_nvml("a100-mig-mixed") as session:
        host = session.host
        inventory = discover(session.nv, host.sysfs_root)
        config = Config(flags=Flags(mig_strategy="mixed"))
        plans = {p.name: p for p in build_resources(inventory, config)}
        plan = plans["nvidia.com/mig-2g.20gb"]
        (device,) = plan.devices
        mig = inventory.mig_device(device.physical_uuid)
        assert mig is not None and mig.parent_index == 1
        settings = replace(
            AllocationSettings.from_config(Config()),
            pass_device_specs=True,
            proc_root=str(host.proc_root),
            device_node_probe_root=str(host.dev_root),
        )
        response = allocate(AllocationIndex(plan, inventory), [[device.id]], settings, UnhealthyIds(()))
        (container,) = response.container_responses
        paths = [d.container_path for d in container.devices]

        # The driver's minors: 3 + 135 per GPU + 9 per GPU instance, the compute instance's next to it.
        gi, ci = mig.gpu_instance_id, mig.compute_instance_id
        gi_cap = 3 + 135 * 1 + 9 * gi
        assert paths == [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",  # no nvidia-modeset: the simulated node has none, so it is left out
            "/dev/nvidia1",
            f"/dev/nvidia-caps/nvidia-cap{gi_cap}",
            f"/dev/nvidia-caps/nvidia-cap{gi_cap + 1 + ci}",
        ]
        assert_all(container.devices, lambda d: d.host_path == d.container_path and d.permissions == "rw")
        for path in paths:  # every node handed out exists in the simulated /dev
            assert (host.dev_root / path.lstrip("/")).is_file(), path
        minors = (host.proc_root / "driver/nvidia-caps/mig-minors").read_text().splitlines()
        assert f"gpu1/gi{gi}/access {gi_cap}" in minors
        assert f"gpu1/gi{gi}/ci{ci}/access {gi_cap + 1 + ci}" in minors
        assert "gpu0/gi1/access 12" in minors and "gpu0/gi1/ci0/access 13" in minors
    assert not host.proc_root.exists()  # the throwaway tree goes with the session
