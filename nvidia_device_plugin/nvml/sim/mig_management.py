"""The simulated pynvml calls that make and destroy MIG instances: possible placements, remaining capacity,
GPU and compute instances, as a real driver answers them.

A GPU instance takes the memory slices of its placement; one that would overlap another, or pass its
profile's instance count, is NVML_ERROR_INSUFFICIENT_RESOURCES. A MIG device appears when its compute
instance is made (one per GPU instance here), in the lowest free MIG device index, with a new `MIG-` UUID,
and from then on answers every MIG query (nvml/sim/mig.py); destroying it leaves a gap in the indices.
Destroying a GPU instance that still has its compute instance, or a compute instance a process holds
(`set_in_use`), is NVML_ERROR_IN_USE; in an unprivileged container every change is NO_PERMISSION. The
first change on a GPU pins every node-file instance where nvml/sim/placement.py had put it, so nothing
moves. Hangs and injected failures apply as to every simulated call (nvml/sim/state.py).
"""

from __future__ import annotations

import ctypes
from dataclasses import replace
from typing import Any

import pynvml

from nvidia_device_plugin.base.uuids import name_uuid
from nvidia_device_plugin.nvml.api import (
    ComputeInstanceHandle,
    ComputeInstanceInfo,
    ComputeInstanceProfileInfo,
    DeviceHandle,
    GpuInstanceHandle,
)
from nvidia_device_plugin.nvml.sim.gi_profiles import GiProfile, profile_by_id, profile_of, profile_template
from nvidia_device_plugin.nvml.sim.host import add_mig_capabilities, gpu_minor, mig_instance_ids
from nvidia_device_plugin.nvml.sim.mig import instance_placement, sms_per_slice
from nvidia_device_plugin.nvml.sim.node import GpuSpec, MigSpec
from nvidia_device_plugin.nvml.sim.state import (
    _COMPUTE_INSTANCE_BASE,
    BareGpuInstance,
    SimulatorState,
    _address,
    _nvml_error,
    pynvml_function,
)

_MAX_MIG_SLOTS = 7  # nvmlDeviceGetMaxMigDeviceCount on these GPUs
_MAX_GI_ID = 14  # the driver's GPU instance IDs run 0..14 (nvml/sim/host.py lists their capabilities)
# Compute-instance profiles (NVML_COMPUTE_INSTANCE_PROFILE_*: their info IDs are the same numbers) by slices.
_CI_PROFILES = {
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
    pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}
_UUID_NAMESPACE = "3b0c6a52-8f1e-4d59-9a57-6d1f0c2b7e41"  # MIG devices made at run time


def _written(ref: object, kind: type) -> Any:
    """What a *Ref argument points to (ctypes.byref, ctypes.pointer, or the array itself); None for None.
    Anything else is INVALID_ARGUMENT here, where the real library would be handed garbage."""
    if ref is None:
        return None
    target = getattr(ref, "_obj", None)  # ctypes.byref(x)
    if target is None and isinstance(ref, ctypes._Pointer):
        target = ref.contents
    if target is None:
        target = ref
    element = getattr(target, "_type_", None) if isinstance(target, ctypes.Array) else None
    if not (isinstance(target, kind) or element is kind):
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    return target


def _fill(items: list[Any], array_ref: object, count_ref: object, kind: type) -> int:
    """Write `items` to the caller's array and their number to its count, as NVML's list calls do: a
    missing or short array gets the count and INSUFFICIENT_SIZE."""
    count = _written(count_ref, ctypes.c_uint)
    if count is None:
        raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
    array = _written(array_ref, kind)
    count.value = len(items)
    if array is None or len(array) < len(items):
        if array is None and kind is pynvml.c_nvmlGpuInstancePlacement_t:
            return int(pynvml.NVML_SUCCESS)  # placements: NULL asks only how many
        raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    for k, item in enumerate(items):
        array[k] = item
    return int(pynvml.NVML_SUCCESS)


class MigManagement(SimulatorState):
    """pynvml's MIG management calls on the simulated node."""

    @pynvml_function
    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, device: DeviceHandle, profileId: int, placementsRef: object, countRef: object
    ) -> int:
        _, profile = self._gpu_and_profile(device, profileId, need_mig_mode=False)
        kind = pynvml.c_nvmlGpuInstancePlacement_t
        items = [kind(start, profile.memory_slices) for start in profile.starts]
        return _fill(items, placementsRef, countRef, kind)

    @pynvml_function
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: DeviceHandle, profileId: int) -> int:
        gpu, profile = self._gpu_and_profile(device, profileId)
        with self._lock:
            taken = self._taken_slices(self.node.gpus[gpu.index])
            made = self._instances_of(self.node.gpus[gpu.index], profile)
        free = 0
        for start in profile.starts:  # aligned placements: taking the lowest free first is optimal
            span = set(range(start, start + profile.memory_slices))
            if not span & taken:
                taken |= span
                free += 1
        return min(free, max(profile.instance_count - len(made), 0))

    @pynvml_function
    def nvmlDeviceCreateGpuInstanceWithPlacement(
        self, device: DeviceHandle, profileId: int, placement: object
    ) -> GpuInstanceHandle:
        gpu, profile = self._gpu_and_profile(device, profileId, change=True)
        start, size = int(getattr(placement, "start", -1)), int(getattr(placement, "size", -1))
        if start not in profile.starts or size != profile.memory_slices:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            gpu = self._pin(self.node.gpus[gpu.index])
            span = set(range(start, start + size))
            full = len(self._instances_of(gpu, profile)) >= profile.instance_count
            if span & self._taken_slices(gpu) or full:
                raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            used = {mig_instance_ids(gpu, m)[0] for m in gpu.mig} | set(self._bare(gpu))
            gi_id = next((g for g in range(1, _MAX_GI_ID + 1) if g not in used), None)
            if gi_id is None:
                raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            self._bare(gpu)[gi_id] = BareGpuInstance(gi_id, profile, start)
        return GpuInstanceHandle(ctypes.cast(self._gi_handle_address(gpu, gi_id), pynvml.c_nvmlGpuInstance_t))

    @pynvml_function
    def nvmlGpuInstanceDestroy(self, gpuInstance: GpuInstanceHandle) -> int:
        gpu, gi_id = self._gpu_instance(gpuInstance)
        self._check_may_change(gpu)
        with self._lock:
            mig, bare = self._instance_of(self.node.gpus[gpu.index], gi_id)
            if mig is not None:  # its compute instance must go first
                raise _nvml_error(pynvml.NVML_ERROR_IN_USE)
            if bare is None:
                raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            del self._bare(gpu)[gi_id]
        return int(pynvml.NVML_SUCCESS)

    @pynvml_function
    def nvmlDeviceGetGpuInstances(
        self, device: DeviceHandle, profileId: int, gpuInstancesRef: object, countRef: object
    ) -> int:
        gpu, profile = self._gpu_and_profile(device, profileId)
        with self._lock:
            ids = sorted(self._instances_of(self.node.gpus[gpu.index], profile))
        kind = pynvml.c_nvmlGpuInstance_t
        items = [ctypes.cast(self._gi_handle_address(gpu, gi), kind) for gi in ids]
        return _fill(items, gpuInstancesRef, countRef, kind)

    @pynvml_function
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, device: GpuInstanceHandle, profile: int, engProfile: int, version: int = 2
    ) -> ComputeInstanceProfileInfo:
        gpu, gi_id = self._gpu_instance(device)
        gi_profile = self._profile_of_instance(gpu, gi_id)
        slices = _CI_PROFILES.get(profile)
        if engProfile != pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if slices is None or slices > gi_profile.gpu_slices:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info: Any = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id = profile
        info.sliceCount = slices
        info.instanceCount = gi_profile.gpu_slices // slices
        info.multiprocessorCount = sms_per_slice(gpu) * slices
        result: ComputeInstanceProfileInfo = info
        return result

    @pynvml_function
    def nvmlGpuInstanceCreateComputeInstance(
        self, gpuInstance: GpuInstanceHandle, profileId: int
    ) -> ComputeInstanceHandle:
        gpu, gi_id = self._gpu_instance(gpuInstance)
        self._check_may_change(gpu)
        slices = _CI_PROFILES.get(profileId)
        with self._lock:
            gpu = self.node.gpus[gpu.index]
            mig, bare = self._instance_of(gpu, gi_id)
            if mig is not None:  # the simulator makes one compute instance per GPU instance
                raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            if bare is None or slices is None or slices > bare.profile.gpu_slices:
                raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            slot = next((s for s in range(_MAX_MIG_SLOTS) if all(m.slot != s for m in gpu.mig)), None)
            if slot is None:
                raise _nvml_error(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
            self._made += 1
            made = replace(
                profile_template(gpu, bare.profile, slices),
                uuid=f"MIG-{name_uuid(_UUID_NAMESPACE, f'{gpu.uuid}/{self._made}')}",
                slot=slot,
                gi_id=gi_id,
                placement=(bare.start, bare.profile.memory_slices),
            )
            del self._bare(gpu)[gi_id]
            self._put_gpu(replace(gpu, mig=tuple(sorted((*gpu.mig, made), key=lambda m: m.slot))))
            if self._host is not None:  # a materialized host: the new device's capability nodes appear
                add_mig_capabilities(self._host, gpu_minor(gpu), gi_id, 0)
        return self._ci_handle(gpu, gi_id, 0)

    @pynvml_function
    def nvmlComputeInstanceDestroy(self, computeInstance: ComputeInstanceHandle) -> int:
        gpu, mig = self._compute_instance(computeInstance)
        self._check_may_change(gpu)
        with self._lock:
            if mig.uuid in self._in_use:
                raise _nvml_error(pynvml.NVML_ERROR_IN_USE)
            gpu = self._pin(self.node.gpus[gpu.index])
            mig = next(m for m in gpu.mig if m.uuid == mig.uuid)
            profile = profile_of(gpu, mig)
            if profile is None or mig.placement is None:  # outside the tables: nothing to fall back to
                raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            gi_id = mig_instance_ids(gpu, mig)[0]
            self._put_gpu(replace(gpu, mig=tuple(m for m in gpu.mig if m.uuid != mig.uuid)))
            self._bare(gpu)[gi_id] = BareGpuInstance(gi_id, profile, mig.placement[0])
        return int(pynvml.NVML_SUCCESS)

    @pynvml_function
    def nvmlGpuInstanceGetComputeInstances(
        self, gpuInstance: GpuInstanceHandle, profileId: int, computeInstancesRef: object, countRef: object
    ) -> int:
        gpu, gi_id = self._gpu_instance(gpuInstance)
        mig, bare = self._instance_of(gpu, gi_id)
        if mig is None and bare is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        matches = mig is not None and _CI_PROFILES.get(profileId) == mig.compute_slices
        items = [self._ci_handle(gpu, gi_id, mig_instance_ids(gpu, mig)[1])] if mig and matches else []
        return _fill(items, computeInstancesRef, countRef, pynvml.c_nvmlComputeInstance_t)

    @pynvml_function
    def nvmlComputeInstanceGetInfo(self, computeInstance: ComputeInstanceHandle) -> ComputeInstanceInfo:
        gpu, mig = self._compute_instance(computeInstance)
        gi_id, ci_id = mig_instance_ids(gpu, mig)
        info: Any = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id = ci_id
        info.profileId = next(p for p, s in _CI_PROFILES.items() if s == mig.compute_slices)
        info.gpuInstance = ctypes.cast(self._gi_handle_address(gpu, gi_id), pynvml.c_nvmlGpuInstance_t)
        info.placement.start, info.placement.size = 0, mig.compute_slices
        result: ComputeInstanceInfo = info
        return result

    # ---- internals ----------------------------------------------------------------------------

    def _gpu_and_profile(
        self, device: DeviceHandle, profile_id: int, need_mig_mode: bool = True, change: bool = False
    ) -> tuple[GpuSpec, GiProfile]:
        gpu, mig = self._device(device)
        if mig is not None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.mig_capable or (need_mig_mode and not gpu.mig_enabled):
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if change:
            self._check_may_change(gpu)
        profile = profile_by_id(gpu, profile_id)
        if profile is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, profile

    def _check_may_change(self, gpu: GpuSpec) -> None:
        if self.node.unprivileged_container:  # making and destroying instances needs CAP_SYS_ADMIN
            raise _nvml_error(pynvml.NVML_ERROR_NO_PERMISSION)
        if not gpu.mig_enabled:
            raise _nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _bare(self, gpu: GpuSpec) -> dict[int, BareGpuInstance]:
        return self._bare_gpu_instances.setdefault(gpu.index, {})

    def _taken_slices(self, gpu: GpuSpec) -> set[int]:
        spans = [instance_placement(gpu, m) for m in gpu.mig]
        spans += [(b.start, b.profile.memory_slices) for b in self._bare(gpu).values()]
        return {s for start, size in spans for s in range(start, start + size)}

    def _instances_of(self, gpu: GpuSpec, profile: GiProfile) -> set[int]:
        """The GPU instance IDs of `profile` on `gpu`, with or without their compute instance."""
        ids = {mig_instance_ids(gpu, m)[0] for m in gpu.mig if profile_of(gpu, m) == profile}
        return ids | {gi for gi, b in self._bare(gpu).items() if b.profile == profile}

    def _profile_of_instance(self, gpu: GpuSpec, gi_id: int) -> GiProfile:
        mig, bare = self._instance_of(gpu, gi_id)
        profile = bare.profile if bare is not None else profile_of(gpu, mig) if mig is not None else None
        if profile is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return profile

    def _pin(self, gpu: GpuSpec) -> GpuSpec:
        """`gpu` with every instance's GPU instance ID and placement fixed where they are now."""
        if all(m.placement is not None for m in gpu.mig):
            return gpu
        pinned = tuple(
            replace(m, gi_id=mig_instance_ids(gpu, m)[0], placement=instance_placement(gpu, m))
            for m in gpu.mig
        )
        return self._put_gpu(replace(gpu, mig=pinned))

    def _put_gpu(self, gpu: GpuSpec) -> GpuSpec:
        """Replace `gpu` in the node (a new frozen NodeSpec: a reader sees one moment or the next)."""
        gpus = tuple(gpu if g.index == gpu.index else g for g in self.node.gpus)
        self.node = replace(self.node, gpus=gpus)
        return gpu

    def _ci_handle(self, gpu: GpuSpec, gi_id: int, ci_id: int) -> ComputeInstanceHandle:
        address = _COMPUTE_INSTANCE_BASE + gpu.index * 0x1000 + gi_id * 0x10 + ci_id
        return ComputeInstanceHandle(ctypes.cast(address, pynvml.c_nvmlComputeInstance_t))

    def _compute_instance(self, handle: object) -> tuple[GpuSpec, MigSpec]:
        gpu_index, rest = divmod(_address(handle) - _COMPUTE_INSTANCE_BASE, 0x1000)
        if not 0 <= gpu_index < len(self.node.gpus):
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        with self._lock:
            self._check_not_lost(gpu_index)
        gpu = self.node.gpus[gpu_index]
        gi_id, ci_id = divmod(rest, 0x10)
        mig = next((m for m in gpu.mig if mig_instance_ids(gpu, m) == (gi_id, ci_id)), None)
        if mig is None:
            raise _nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu, mig
