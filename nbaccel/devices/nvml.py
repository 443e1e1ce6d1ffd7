"""The GPUs this process may use, asked of NVML (``libnvidia-ml.so.1``), never of the CUDA driver.

``torch.cuda.device_count()`` asks NVML too, but falls back to ``cuInit`` where NVML cannot
answer (MIG UUIDs in ``CUDA_VISIBLE_DEVICES``, a container without ``libnvidia-ml``), and a
kernel that ran ``cuInit`` can no longer fork ranks. Here ``CUDA_VISIBLE_DEVICES`` is read the
way the CUDA runtime (and torch's NVML path) reads it: indices, ``GPU-`` and ``MIG-`` UUIDs or
their unique prefixes, up to the first entry that names nothing, a repeated entry meaning none,
and an empty value meaning no device. Where NVML is missing, the count is asked of the driver in
a short-lived child process (never in this one); no driver at all means no GPU.

``NBACCEL_NVML_LIBRARY`` names another library to ask (a test seam: the tests build a fake one).

Example:
    >>> parse_visible_devices("0,2")
    ['0', '2']
    >>> visible_count() >= 0  # 0 on a machine without NVIDIA GPUs
    True
"""

from __future__ import annotations

import ctypes
import functools
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nbaccel.devices import driver

LIBRARY = "libnvidia-ml.so.1"
LIBRARY_VARIABLE = "NBACCEL_NVML_LIBRARY"
NVML_SUCCESS = 0
_TEXT = 96  # NVML's longest UUID, name and version buffers are 80 bytes


@dataclass(frozen=True)
class Gpu:
    """One physical GPU as NVML lists it (MIG instances by UUID under ``mig_uuids``)."""

    index: int
    uuid: str
    name: str
    capability: tuple[int, int]
    mig_uuids: tuple[str, ...] = field(default=())


def library_path() -> str:
    """The NVML library to ask: ``libnvidia-ml.so.1``, or the test seam's ``NBACCEL_NVML_LIBRARY``."""
    return os.environ.get(LIBRARY_VARIABLE) or LIBRARY


@functools.lru_cache(maxsize=4)
def _open(path: str) -> ctypes.CDLL | None:
    """NVML loaded and initialised once per library path; None where it cannot be."""
    try:
        library = ctypes.CDLL(path)
    except OSError:
        return None
    init = getattr(library, "nvmlInit_v2", None) or getattr(library, "nvmlInit", None)
    if init is None or init() != NVML_SUCCESS:
        return None
    return library


def library() -> ctypes.CDLL | None:
    """NVML, loaded and initialised (once per library path); None where it cannot be.

    >>> library() is None or hasattr(library(), "nvmlDeviceGetCount_v2")
    True
    """
    return _open(library_path())


def machine_gpus() -> list[Gpu] | None:
    """Every GPU of this machine in NVML's order, or None where NVML cannot answer."""
    library = _open(library_path())
    if library is None:
        return None
    count = ctypes.c_uint(0)
    if library.nvmlDeviceGetCount_v2(ctypes.byref(count)) != NVML_SUCCESS:
        return None
    gpus = []
    for index in range(count.value):
        handle = ctypes.c_void_p()
        if library.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != NVML_SUCCESS:
            return None
        gpus.append(_describe(library, index, handle))
    return gpus


def _describe(library: ctypes.CDLL, index: int, handle: ctypes.c_void_p) -> Gpu:
    major, minor = ctypes.c_int(0), ctypes.c_int(0)
    if library.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor)) != NVML_SUCCESS:
        major.value = minor.value = 0
    return Gpu(
        index, _text(library.nvmlDeviceGetUUID, handle), _text(library.nvmlDeviceGetName, handle), (major.value, minor.value), _mig_uuids(library, handle)
    )


def _mig_uuids(library: ctypes.CDLL, handle: ctypes.c_void_p) -> tuple[str, ...]:
    """The UUIDs of the MIG instances on one GPU (none where MIG is off or unsupported)."""
    slots = ctypes.c_uint(0)
    if getattr(library, "nvmlDeviceGetMaxMigDeviceCount", None) is None:
        return ()
    if library.nvmlDeviceGetMaxMigDeviceCount(handle, ctypes.byref(slots)) != NVML_SUCCESS:
        return ()
    uuids = []
    for slot in range(slots.value):
        mig = ctypes.c_void_p()
        if library.nvmlDeviceGetMigDeviceHandleByIndex(handle, ctypes.c_uint(slot), ctypes.byref(mig)) == NVML_SUCCESS:
            uuids.append(_text(library.nvmlDeviceGetUUID, mig))
    return tuple(uuids)


def _text(call: Any, *args: object) -> str:
    buffer = ctypes.create_string_buffer(_TEXT)
    if call(*args, buffer, ctypes.c_uint(_TEXT)) != NVML_SUCCESS:
        return ""
    return buffer.value.decode("utf-8", "replace")


def driver_version() -> str | None:
    """The NVIDIA driver's version ("550.54.15"), or None where NVML cannot answer."""
    library = _open(library_path())
    if library is None:
        return None
    return _text(library.nvmlSystemGetDriverVersion) or None


def cuda_driver_version() -> tuple[int, int] | None:
    """The newest CUDA the driver supports (``(12, 8)``), or None where NVML cannot answer."""
    library = _open(library_path())
    call = getattr(library, "nvmlSystemGetCudaDriverVersion_v2", None) if library is not None else None
    version = ctypes.c_int(0)
    if call is None or call(ctypes.byref(version)) != NVML_SUCCESS or version.value <= 0:
        return None
    return version.value // 1000, version.value % 1000 // 10


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def memory_info(index: int) -> tuple[int, int] | None:
    """(used, total) bytes of NVML's GPU ``index``, by every process; None where NVML cannot say."""
    library = _open(library_path())
    if library is None:
        return None
    handle, memory = ctypes.c_void_p(), _Memory()
    if library.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != NVML_SUCCESS:
        return None
    if library.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) != NVML_SUCCESS:
        return None
    return int(memory.used), int(memory.total)


def parse_visible_devices(value: str | None) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as its entries (None: unset, every device), cut where CUDA stops.

    >>> parse_visible_devices("1,x,2"), parse_visible_devices(""), parse_visible_devices("0,0")
    (['1'], [], [])
    """
    if value is None:
        return None
    entries: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry in entries:  # a repeated device makes CUDA see none at all
            return []
        if not (entry.startswith(("GPU-", "MIG-")) or entry[:1].isdigit()):
            break
        entries.append(entry if entry.startswith(("GPU-", "MIG-")) else _leading_digits(entry))
    return entries


def _leading_digits(entry: str) -> str:
    digits = len(entry) - len(entry.lstrip("0123456789"))
    return str(int(entry[:digits]))


def visible(gpus: Sequence[Gpu], environ: Mapping[str, str] | None = None) -> list[Gpu]:
    """The devices CUDA will show this process, in its order (a MIG instance as its parent GPU)."""
    entries = parse_visible_devices((os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES"))
    if entries is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in entries:
        gpu = _find(gpus, entry)
        if gpu is None:  # CUDA stops at the first entry that names no device
            break
        chosen.append(gpu)
    return chosen


def _find(gpus: Sequence[Gpu], entry: str) -> Gpu | None:
    if entry.isdigit():
        return gpus[int(entry)] if int(entry) < len(gpus) else None
    matches = [g for g in gpus for uuid in (g.mig_uuids if entry.startswith("MIG-") else (g.uuid,)) if uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None  # an ambiguous prefix names nothing


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[Gpu] | None:
    """The GPUs this process may use, in CUDA's order; None where NVML cannot answer."""
    gpus = machine_gpus()
    return None if gpus is None else visible(gpus, environ)


def visible_count(environ: Mapping[str, str] | None = None) -> int:
    """How many CUDA devices this process may use; never initialises CUDA in this process."""
    env = os.environ if environ is None else environ
    if parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES")) == []:
        return 0
    found = visible_gpus(env)
    if found is not None:
        return len(found)
    if not driver.driver_present():  # no NVIDIA driver at all (a CPU machine): no GPU, no child
        return 0
    return _count_in_child(env.get("CUDA_VISIBLE_DEVICES"), driver.library_path())


# The fallback without NVML: the driver counts (and so honours CUDA_VISIBLE_DEVICES, MIG included)
# in a child process that runs cuInit and exits; this process stays uninitialised. Cached per value.
_COUNT_SCRIPT = """
import ctypes, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError:
    print(0); raise SystemExit
n = ctypes.c_int(0)
print(n.value if lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0 else 0)
"""


@functools.lru_cache(maxsize=8)
def _count_in_child(visible_devices: str | None, driver_library: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    if visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible_devices
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _COUNT_SCRIPT, driver_library], check=False, env=env, capture_output=True, text=True, timeout=30
        )
        return int(done.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


def lowest_capability(environ: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """The lowest compute capability among the visible GPUs; None where NVML cannot tell."""
    found = visible_gpus(environ)
    if not found or any(g.capability == (0, 0) for g in found):
        return None
    return min(g.capability for g in found)


def supports_bf16(capability: tuple[int, int]) -> bool:
    """bf16 needs compute capability 8.0 (Ampere) or newer, as ``torch.cuda.is_bf16_supported``.

    >>> supports_bf16((8, 0)), supports_bf16((7, 5))
    (True, False)
    """
    return capability >= (8, 0)


def physical_name(device: str, environ: Mapping[str, str] | None = None) -> str:
    """``device`` as this process names it, with the physical GPU it is where they differ.

    A rank given ``--gpus 3`` sees that GPU as ``cuda:0`` (``CUDA_VISIBLE_DEVICES=3``).

    >>> physical_name("cuda:0", {"CUDA_VISIBLE_DEVICES": "3"}), physical_name("cuda:1", {})
    ('cuda:0 (GPU 3)', 'cuda:1')
    """
    kind, _, index = device.partition(":")
    entries = parse_visible_devices((os.environ if environ is None else environ).get("CUDA_VISIBLE_DEVICES"))
    if kind != "cuda" or not entries:
        return device
    entry = entries[int(index or 0)] if int(index or 0) < len(entries) else None
    if entry is None or entry == (index or "0"):
        return device
    return f"{device} (GPU {entry})"
