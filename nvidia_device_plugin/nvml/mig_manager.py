"""Making and destroying MIG devices on a GPU in MIG mode: what dynamic MIG does at Prepare and Unprepare.

Each verb runs as one job on its GPU's lane (nvml/bounded.py), within the call deadline: a create the driver
never returns from fails as STUCK instead of holding its caller, and never holds up another GPU (what it
made, should it return later, is seen by the next discovery). Every failure raises MigChangeFailed with
NVML's kind (nvml/errors.py: INSUFFICIENT_RESOURCES when the slices are taken, IN_USE when a process holds
the instance, NO_PERMISSION without CAP_SYS_ADMIN, ...) and its reason in an operator's words.

A create is whole or nothing: a GPU instance whose compute instance cannot be made (or whose MIG device
cannot be found) is destroyed again before the error is raised. A destroy of what is already gone succeeds:
Unprepare may run twice.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import pynvml

from nvidia_device_plugin.base.errors import NvmlError
from nvidia_device_plugin.nvml.api import (
    ComputeInstanceHandle,
    DeviceHandle,
    GpuInstanceHandle,
    GpuInstanceProfileInfo,
    NvmlApi,
)
from nvidia_device_plugin.nvml.bounded import on_lane
from nvidia_device_plugin.nvml.errors import NvmlErrorKind, classify, describe, error_code, kind_of_code
from nvidia_device_plugin.nvml.mig_placements import possible_placements, supported_profiles

log = logging.getLogger(__name__)
T = TypeVar("T")

# The compute-instance profile that spans a whole GPU instance of n compute slices (one MIG device per
# GPU instance, as NVIDIA's DRA driver makes them).
_FULL_CI_PROFILE = {
    1: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE,
    2: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_2_SLICE,
    3: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
    4: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_4_SLICE,
    6: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_6_SLICE,
    7: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_7_SLICE,
    8: pynvml.NVML_COMPUTE_INSTANCE_PROFILE_8_SLICE,
}
MAX_COMPUTE_INSTANCES = 8  # per GPU instance (a 7g GPU instance holds seven 1-slice ones)
_EMPTY_SLOT = frozenset({NvmlErrorKind.NOT_FOUND, NvmlErrorKind.INVALID_ARGUMENT})


class MigChangeFailed(NvmlError):
    """Making or destroying a MIG device failed; `kind` is NVML's reason (nvml/errors.py)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message, code=code)
        self.kind = kind_of_code(code)


@dataclass(frozen=True)
class Placement:
    """One place a GPU instance of one profile can be made."""

    gi_profile_id: int  # NVML's profile `id` (19: 1g.10gb on A100-80GB)
    start: int  # first memory slice
    size: int  # memory slices


@dataclass(frozen=True)
class MadeMigDevice:
    gi_id: int
    ci_id: int
    uuid: str  # "MIG-<uuid>"


class MigManager:
    """The MIG-management verbs on the GPUs of one NVML session (`nv`: bounded, or bare in tools)."""

    def __init__(self, nv: NvmlApi) -> None:
        self._nv = nv

    def possible_placements(self, gpu: int) -> tuple[Placement, ...]:
        """Every possible placement of every GPU-instance profile GPU `gpu` has, free or taken."""

        def job() -> tuple[Placement, ...]:
            handle = self._nv.nvmlDeviceGetHandleByIndex(gpu)
            return tuple(
                Placement(int(info.id), start, size)
                for _, info in supported_profiles(self._nv, handle)
                for start, size in possible_placements(self._nv, handle, int(info.id))
            )

        return self._run(gpu, f"reading the possible MIG placements of GPU {gpu}", job)

    def create(self, gpu: int, profile: int, start: int) -> MadeMigDevice:
        """A MIG device of GPU-instance profile `profile` (its NVML `id`) at memory slice `start` of GPU
        `gpu`: a GPU instance there and one compute instance spanning it."""
        what = f"creating a MIG device of profile {profile} at slice {start} on GPU {gpu}"

        def job() -> MadeMigDevice:
            handle = self._nv.nvmlDeviceGetHandleByIndex(gpu)
            info = self._profile(handle, gpu, profile)
            placement = self._placement(handle, gpu, profile, start)
            gi = self._nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile, placement)
            try:
                return self._fill_gpu_instance(handle, gi, info)
            except pynvml.NVMLError as exc:
                self._undo(gi, what, exc)
                raise

        return self._run(gpu, what, job)

    def destroy(self, gpu: int, gi_id: int, ci_id: int) -> None:
        """Destroy compute instance `ci_id` and then GPU instance `gi_id` of GPU `gpu`."""

        def job() -> None:
            handle = self._nv.nvmlDeviceGetHandleByIndex(gpu)
            try:
                gi = self._nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
            except pynvml.NVMLError as exc:
                if classify(exc) is not NvmlErrorKind.NOT_FOUND:
                    raise
                log.info("MIG GPU instance %d of GPU %d is already gone", gi_id, gpu)
                return
            ci = self._compute_instance(gi, ci_id)
            if ci is not None:
                self._nv.nvmlComputeInstanceDestroy(ci)
            self._nv.nvmlGpuInstanceDestroy(gi)

        self._run(gpu, f"destroying MIG GPU instance {gi_id} (compute instance {ci_id}) of GPU {gpu}", job)

    # ---- steps ------------------------------------------------------------------------------------

    def _run(self, gpu: int, what: str, job: Callable[[], T]) -> T:
        try:
            return on_lane(self._nv, gpu, what, job)
        except pynvml.NVMLError as exc:
            code = error_code(exc)
            raise MigChangeFailed(f"{what}: {describe(exc)} (NVML error {code})", code) from exc

    def _profile(self, handle: DeviceHandle, gpu: int, profile: int) -> GpuInstanceProfileInfo:
        for _, info in supported_profiles(self._nv, handle):
            if int(info.id) == profile:
                return info
        raise MigChangeFailed(
            f"GPU {gpu} has no MIG GPU-instance profile with ID {profile}", pynvml.NVML_ERROR_INVALID_ARGUMENT
        )

    def _placement(self, handle: DeviceHandle, gpu: int, profile: int, start: int) -> object:
        possible = possible_placements(self._nv, handle, profile)
        size = next((size for s, size in possible if s == start), None)
        if size is None:
            starts = ", ".join(str(s) for s, _ in possible)
            raise MigChangeFailed(
                f"slice {start} is no placement of MIG profile {profile} on GPU {gpu} (possible: {starts})",
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            )
        return pynvml.c_nvmlGpuInstancePlacement_t(start, size)

    def _fill_gpu_instance(
        self, handle: DeviceHandle, gi: GpuInstanceHandle, info: GpuInstanceProfileInfo
    ) -> MadeMigDevice:
        """One compute instance over all of `gi`, and the MIG device it makes."""
        ci_profile = _FULL_CI_PROFILE.get(int(info.sliceCount))
        if ci_profile is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        ci_info = self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, shared)
        ci = self._nv.nvmlGpuInstanceCreateComputeInstance(gi, int(ci_info.id))
        try:
            gi_id = int(self._nv.nvmlGpuInstanceGetInfo(gi).id)
            ci_id = int(self._nv.nvmlComputeInstanceGetInfo(ci).id)
            return MadeMigDevice(gi_id, ci_id, self._mig_uuid(handle, gi_id, ci_id))
        except pynvml.NVMLError:
            self._nv.nvmlComputeInstanceDestroy(ci)
            raise

    def _mig_uuid(self, handle: DeviceHandle, gi_id: int, ci_id: int) -> str:
        """The UUID of the MIG device of (gi_id, ci_id): its index is the driver's choice, so look."""
        nv = self._nv
        for index in range(int(nv.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except pynvml.NVMLError as exc:
                if classify(exc) in _EMPTY_SLOT:  # a gap left by a destroyed instance
                    continue
                raise
            if (nv.nvmlDeviceGetGpuInstanceId(mig), nv.nvmlDeviceGetComputeInstanceId(mig)) == (gi_id, ci_id):
                return nv.nvmlDeviceGetUUID(mig)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)

    def _compute_instance(self, gi: GpuInstanceHandle, ci_id: int) -> ComputeInstanceHandle | None:
        """Compute instance `ci_id` of `gi`, looked for under every compute-instance profile; None if gone."""
        shared = pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
        for ci_profile in sorted(set(_FULL_CI_PROFILE.values())):
            try:
                info = self._nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(gi, ci_profile, shared)
            except pynvml.NVMLError as exc:
                if classify(exc) in (NvmlErrorKind.NOT_SUPPORTED, NvmlErrorKind.INVALID_ARGUMENT):
                    continue
                raise
            found = (pynvml.c_nvmlComputeInstance_t * MAX_COMPUTE_INSTANCES)()
            count = ctypes.c_uint(0)
            self._nv.nvmlGpuInstanceGetComputeInstances(gi, int(info.id), found, ctypes.byref(count))
            for ci in found[: min(count.value, MAX_COMPUTE_INSTANCES)]:
                if int(self._nv.nvmlComputeInstanceGetInfo(ComputeInstanceHandle(ci)).id) == ci_id:
                    return ComputeInstanceHandle(ci)
        return None

    def _undo(self, gi: GpuInstanceHandle, what: str, cause: pynvml.NVMLError) -> None:
        """Destroy the GPU instance a failed create made; a failure here is logged with both reasons."""
        try:
            self._nv.nvmlGpuInstanceDestroy(gi)
        except pynvml.NVMLError as exc:
            log.error(
                "%s failed (%s) and the GPU instance it made could not be destroyed again: %s",
                what,
                describe(cause),
                describe(exc),
            )
