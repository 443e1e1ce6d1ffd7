"""How much memory each process holds on a GPU, and how busy the GPU is, asked of NVML (never of CUDA).

The kernel (and each node's agent) samples its ranks through this once a second
(``nbaccel.launch.sampler``); it must never run ``cuInit``, so it asks ``libnvidia-ml`` only:
``nvmlDeviceGetComputeRunningProcesses`` (``_v3``, whose record is longer from driver R535 on,
else ``_v2``, else the first version with its shorter record) for each process's memory,
matched on the pid, and
``nvmlDeviceGetUtilizationRates`` for the share of the last sample period in which a kernel ran
(NVML's figure; on a MIG instance it is not supported and reads None). One list and one
utilisation call per device per sample, whatever the number of ranks on it.

Pids: NVML reports processes by their pid in the machine's first pid namespace. In a container
with its own pid namespace (docker without ``--pid=host``) no pid NVML lists is one of this
namespace's ranks, and no pid can be translated from inside (``/proc/<pid>/status`` ``NSpid``
shows only the inner one): the rank's GPU memory is then unknown (None, shown as nothing), never
guessed from another process's figure; the utilisation, a property of the device, still shows.

Example:
    >>> GpuUse.open({}) is None  # no rank on a GPU: NVML is not even loaded
    True
    >>> use = GpuUse.open({0: 0})  # rank 0 on cuda:0; None on a machine without NVML
    >>> use is None or set(use.sample([0])) == {use.devices[0]}
    True
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nbaccel.devices import nvml

NVML_ERROR_INSUFFICIENT_SIZE = 7
_NOT_AVAILABLE = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE: the memory of a process NVML may not read
_FIRST_GUESS = 32  # records asked for at first; grown when NVML says more processes run


class _ProcessInfo(ctypes.Structure):
    """``nvmlProcessInfo_v2_t``: the record of ``_v2``, and of ``_v3`` before driver R535."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _ProcessInfoV3(ctypes.Structure):
    """What ``_v3`` fills from driver R535 on: the same call, a longer record (v2's fields plus
    ``usedGpuCcProtectedMemory``). Read with v2's layout, every pid after the first is garbage
    (the bug tools such as nvitop and pynvml had with R535)."""

    _fields_ = [*_ProcessInfo._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


_LONGER_V3_FROM = 535  # the driver branch whose _v3 fills _ProcessInfoV3


class _ProcessInfoV1(ctypes.Structure):
    """``nvmlProcessInfo_v1_t``: the record of the unversioned call of older drivers."""

    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _Utilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


@dataclass(frozen=True)
class DeviceUse:
    """One device's answer in one sample: pid -> bytes it holds (None: NVML could not list), busy %."""

    memory: dict[int, int] | None
    utilisation: int | None


class GpuUse:
    """The NVML devices of a set of ranks (rank -> CUDA index as this process sees it), asked together."""

    def __init__(self, library: ctypes.CDLL, handles: dict[int, ctypes.c_void_p], devices: dict[int, int]) -> None:
        self._library = library
        self._handles = handles  # NVML index -> handle
        self.devices = devices  # rank -> NVML index
        self._list_processes, self._record = _process_call(library)

    @classmethod
    def open(cls, cuda_indices: Mapping[int, int]) -> GpuUse | None:
        """For ranks on CUDA (rank -> its ``cuda:N`` as this process's CUDA_VISIBLE_DEVICES names it);
        None where no rank is on a GPU or NVML cannot say which device each is."""
        if not cuda_indices:
            return None
        library = nvml.library()
        gpus = nvml.visible_gpus() if library is not None else None
        if library is None or not gpus:
            return None
        devices = {rank: gpus[index].index for rank, index in cuda_indices.items() if 0 <= index < len(gpus)}
        handles = {}
        for index in set(devices.values()):
            handle = ctypes.c_void_p()
            if library.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) == nvml.NVML_SUCCESS:
                handles[index] = handle
        devices = {rank: index for rank, index in devices.items() if index in handles}
        return cls(library, handles, devices) if devices else None

    def sample(self, ranks: Iterable[int]) -> dict[int, DeviceUse]:
        """NVML index -> its use now, for the devices of ``ranks`` (each device asked once)."""
        wanted = {self.devices[rank] for rank in ranks if rank in self.devices}
        return {index: DeviceUse(self._memory(self._handles[index]), self._utilisation(self._handles[index])) for index in wanted}

    def processes(self, index: int) -> dict[int, int | None] | None:
        """pid -> bytes of every process NVML lists on NVML's GPU ``index`` (None: NVML may not
        read that process's memory); None where NVML cannot list them."""
        listed = self._listed(self._handles[index]) if index in self._handles else None
        return None if listed is None else {int(r.pid): None if r.usedGpuMemory == _NOT_AVAILABLE else int(r.usedGpuMemory) for r in listed}

    def _memory(self, handle: ctypes.c_void_p) -> dict[int, int] | None:
        listed = self._listed(handle)
        return None if listed is None else {int(r.pid): int(r.usedGpuMemory) for r in listed if r.usedGpuMemory != _NOT_AVAILABLE}

    def _listed(self, handle: ctypes.c_void_p) -> list[Any] | None:
        if self._list_processes is None:
            return None
        size = _FIRST_GUESS
        for _ in range(3):  # processes may start between the asking and the second call
            records = (self._record * size)()
            count = ctypes.c_uint(size)
            code = self._list_processes(handle, ctypes.byref(count), records)
            if code == nvml.NVML_SUCCESS:
                return list(records[: count.value])
            if code != NVML_ERROR_INSUFFICIENT_SIZE:
                return None
            size = max(count.value, size) * 2
        return None

    def _utilisation(self, handle: ctypes.c_void_p) -> int | None:
        rates = _Utilization()
        if self._library.nvmlDeviceGetUtilizationRates(handle, ctypes.byref(rates)) != nvml.NVML_SUCCESS:
            return None  # a MIG instance, or a GPU that does not say
        return int(rates.gpu)


def _process_call(library: ctypes.CDLL) -> tuple[Any, type[ctypes.Structure]]:
    """The newest per-process memory call the library has, with the record it fills."""
    v3 = getattr(library, "nvmlDeviceGetComputeRunningProcesses_v3", None)
    if v3 is not None:
        return v3, _ProcessInfoV3 if _driver_branch() >= _LONGER_V3_FROM else _ProcessInfo
    for name, record in (("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfo), ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1)):
        call = getattr(library, name, None)
        if call is not None:
            return call, record
    return None, _ProcessInfo


def _driver_branch() -> int:
    """The driver's major version ("550.54.15" -> 550); a library that does not say is taken as new."""
    version = nvml.driver_version() or ""
    major = version.split(".", 1)[0]
    return int(major) if major.isdigit() else _LONGER_V3_FROM
