"""Health policy as pure functions: XID reasons and attribution of an XID to MIG devices."""

from __future__ import annotations

from nvidia_device_plugin.devices import Gpu, MigDevice
from nvidia_device_plugin.health.policy import attribute_xid, xid_reason

# ---- pure policy ------------------------------------------------------------------------------------


def mig_gpu() -> Gpu:
    migs = tuple(
        MigDevice(
            uuid=f"MIG-{n}",
            index=n,
            parent_uuid="GPU-x",
            parent_index=0,
            profile="1g.10gb",
            memory_bytes=10 << 30,
            gpu_instance_id=gi,
            compute_instance_id=ci,
        )
        for n, (gi, ci) in enumerate([(1, 0), (2, 0), (2, 1)])
    )
    return Gpu(
        index=0,
        uuid="GPU-x",
        name="NVIDIA A100-SXM4-80GB",
        memory_bytes=80 << 30,
        pci_bus_id="00000000:07:00.0",
        minor=0,
        numa_node=0,
        mig_enabled=True,
        mig_devices=migs,
    )


def test_xid_attribution_to_mig_devices() -> None:
    gpu = mig_gpu()
    assert attribute_xid(gpu, 2, 1) == ["MIG-2"]
    assert attribute_xid(gpu, 2, None) == ["MIG-1", "MIG-2"]  # the whole GPU instance
    assert attribute_xid(gpu, None, None) == ["GPU-x"]
    assert attribute_xid(gpu, 7, 0) == ["GPU-x"]  # no such instance
    assert attribute_xid(gpu, 1, 5) == ["GPU-x"]
    whole = Gpu(**{**gpu.__dict__, "mig_enabled": False, "mig_devices": ()})
    assert attribute_xid(whole, 1, 0) == ["GPU-x"]


def test_xid_reason_names_well_known_xids() -> None:
    assert xid_reason(79) == "XID 79 (GPU has fallen off the bus)"
    assert xid_reason(4242) == "XID 4242"
