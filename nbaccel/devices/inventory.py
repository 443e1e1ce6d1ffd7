"""The one map of this process's GPUs: which ones the installed torch can drive, who else is on them.

Every place that decides GPUs asks here: the kernel's plan (``nbaccel.launch.plan``), the node
agent's count, the state API in the kernel. A GPU counts only when the installed torch can use
it (``nbaccel.devices.torch_build``): NVIDIA GPUs through NVML for a CUDA build, AMD GPUs from
the KFD topology for a ROCm build, Intel GPUs from the DRM render nodes for an XPU build; GPUs
of another kind (a CPU-only torch on an NVIDIA box, a CUDA torch beside AMD GPUs) are named in
``notes`` with the install command that would use them. Nothing initialises CUDA, HIP or Level
Zero in this process.

``occupants`` says which other processes hold memory on each GPU (NVML's per-process list, or
KFD's ``vram_<gpu_id>`` files), for a shared box's plan.

Example:
    >>> from nbaccel.devices.torch_build import TorchBuild
    >>> found = gpu_inventory(build=TorchBuild("2.13.0+cpu", None, None, None))
    >>> found.device_type, found.devices  # a CPU-only torch: no GPU counts, whatever the machine has
    ('cpu', ())
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from nbaccel.devices import amd, driver, intel, nvml
from nbaccel.devices.gpu_use import GpuUse
from nbaccel.devices.torch_build import TorchBuild, install_hint, installed_build

_VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}


@dataclass(frozen=True)
class Device:
    """One GPU as this process's torch numbers it (``cuda:index`` / ``xpu:index``).

    ``key`` names it for its vendor's queries: NVML's index, KFD's ``gpu_id``, or the Intel
    GPU's place in PCI order.
    """

    index: int
    name: str
    key: int


@dataclass(frozen=True)
class Inventory:
    """The GPUs this process may use with its torch, and why others present are not counted."""

    device_type: str  # "cuda" (NVIDIA or AMD), "xpu" or "cpu"
    vendor: str  # "nvidia", "amd", "intel", or "" (no GPU counts)
    devices: tuple[Device, ...] = ()
    notes: tuple[str, ...] = field(default=())  # one line each: GPUs here that this torch cannot use


@dataclass(frozen=True)
class Occupant:
    """Other processes' hold on one GPU: ``pids`` -> bytes (None: not readable); ``unlisted``, the
    memory in use that no listed process holds (ours included in the listed), and ``total``
    (None where unknown)."""

    pids: dict[int, int | None]
    unlisted: int | None = None
    total: int | None = None


def _occupant(listed: Mapping[int, int | None], mine: set[int], used: int | None, total: int | None) -> Occupant:
    others = {pid: held for pid, held in listed.items() if pid not in mine}
    unlisted = None if used is None else max(0, used - sum(held or 0 for held in listed.values()))
    return Occupant(others, unlisted, total)


def gpu_inventory(environ: Mapping[str, str] | None = None, build: TorchBuild | None = None) -> Inventory:
    """This process's usable GPUs under ``environ``'s visibility variables (default: its own).

    ``build`` defaults to the imported torch's; where torch is not imported, NVIDIA GPUs are
    counted as before a build could be read (the kernel's state API imports torch first).
    """
    env = os.environ if environ is None else environ
    build = installed_build() if build is None else build
    vendor = build.vendor if build is not None else "nvidia"
    devices = _devices(vendor, env) if vendor else ()
    notes = _unusable(build, env) if build is not None else ()
    return Inventory(build.device_type if build is not None else ("cuda" if devices else "cpu"), vendor if devices else "", devices, notes)


def _devices(vendor: str, env: Mapping[str, str]) -> tuple[Device, ...]:
    if vendor == "amd":
        return tuple(Device(i, g.name, g.gpu_id) for i, g in enumerate(amd.visible_gpus(env)))
    if vendor == "intel":
        return tuple(Device(i, f"Intel GPU {g.device_id:#06x}", g.index) for i, g in enumerate(intel.visible_gpus(env)))
    found = nvml.visible_gpus(env)
    if found is not None:
        return tuple(Device(i, g.name, g.index) for i, g in enumerate(found))
    # NVML cannot answer: the driver counts in a child process; the GPUs' names are unknown
    return tuple(Device(i, "", i) for i in range(nvml.visible_count(env)))


def _unusable(build: TorchBuild, env: Mapping[str, str]) -> tuple[str, ...]:
    """One line per kind of GPU here that ``build`` cannot drive (machine-wide: a CPU torch makes
    even the GPUs hidden by the visibility variables pointless)."""
    notes = []
    for vendor, count in _present(build.vendor).items():
        if count:
            notes.append(
                f"{build.describe()} and cannot use the {count} {_VENDOR_NAMES[vendor]} GPU(s) here, so the ranks run on CPU with gloo; "
                f"for the GPUs install {_kind_for(vendor)} build: {install_hint(vendor, nvml.cuda_driver_version() if vendor == 'nvidia' else None)}"
                if not build.vendor
                else f"{build.describe()}; the {count} {_VENDOR_NAMES[vendor]} GPU(s) here need {_kind_for(vendor)} build ({install_hint(vendor)}) and are not used"
            )
    return tuple(notes)


def _present(skip: str) -> dict[str, int]:
    """How many GPUs of each vendor but ``skip`` this machine has (nothing initialised)."""
    counts = {}
    if skip != "nvidia":
        gpus = nvml.machine_gpus()
        counts["nvidia"] = len(gpus) if gpus is not None else (nvml.visible_count({}) if driver.driver_present() else 0)
    if skip != "amd":
        counts["amd"] = len(amd.machine_gpus())
    if skip != "intel":
        counts["intel"] = len(intel.machine_gpus())
    return counts


def _kind_for(vendor: str) -> str:
    return {"nvidia": "a CUDA", "amd": "a ROCm", "intel": "an XPU"}[vendor]


def open_use(vendor: str, indices: Mapping[int, int]) -> GpuUse | amd.AmdGpuUse | None:
    """The sampler's view of the ranks' GPUs (rank -> device index as this process sees it):
    NVML for NVIDIA, KFD's files for AMD; None for Intel GPUs (no per-process memory without
    Level Zero) or where nothing can be asked."""
    if vendor == "amd":
        return amd.AmdGpuUse.open(indices)
    if vendor in ("nvidia", ""):
        return GpuUse.open(indices)
    return None


def occupants(inventory: Inventory, own_pids: Sequence[int] = ()) -> dict[int, Occupant]:
    """Device index -> the other processes on it, for each device someone else uses.

    ``own_pids`` (default: this process) are not "others". NVIDIA: NVML's per-process list and
    memory in use; AMD: KFD's per-process files and amdgpu's memory in use. Intel GPUs publish
    no per-process memory without Level Zero: none is ever reported busy.
    """
    mine = set(own_pids) | {os.getpid()}
    if inventory.vendor == "nvidia":
        return _nvidia_occupants(inventory.devices, mine)
    if inventory.vendor == "amd":
        return _amd_occupants(inventory.devices, mine)
    return {}


def _nvidia_occupants(devices: Sequence[Device], mine: set[int]) -> dict[int, Occupant]:
    use = GpuUse.open({d.index: d.index for d in devices})  # "rank" d.index on cuda:d.index
    if use is None:
        return {}
    found = {}
    for device in devices:
        used, total = nvml.memory_info(device.key) or (None, None)
        found[device.index] = _occupant(use.processes(device.key) or {}, mine, used, total)
    return found


def _amd_occupants(devices: Sequence[Device], mine: set[int]) -> dict[int, Occupant]:
    held = amd.process_vram(d.key for d in devices)
    gpus = {g.gpu_id: g for g in amd.machine_gpus()}
    found = {}
    for device in devices:
        gpu = gpus.get(device.key)
        listed: dict[int, int | None] = dict(held.get(device.key, {}))
        found[device.index] = _occupant(listed, mine, amd.vram_used(gpu) if gpu else None, gpu.vram_total if gpu else None)
    return found
