"""AMD GPUs (ROCm), read off the KFD topology in sysfs: never through HIP, which would initialise in the kernel.

A ROCm build of torch drives AMD GPUs through ``torch.cuda`` (device type ``cuda``, RCCL under
the backend name ``nccl``). Its own counting (``torch.cuda.device_count()``) asks amdsmi, or
initialises HIP where amdsmi is missing, and ``torch.cuda.is_available()`` without
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` runs ``hipGetDeviceCount``: after that a forked rank's HIP
runtime is a broken copy of the kernel's. So the kernel counts here, from files the amdgpu
driver publishes: every node of ``/sys/class/kfd/kfd/topology/nodes`` whose ``gpu_id`` is not 0
is a GPU, in the order ROCr enumerates its agents. amdsmi is not used: its process record
changed layout between ROCm releases (``name[32]`` then ``name[256]``, the trailing reserved
words), two copies of it in one process clash (pytorch #186516), and it reads these same files.

Visibility follows the HIP runtime: ``ROCR_VISIBLE_DEVICES`` first (indices into this list, or
``GPU-<unique id>``), then ``HIP_VISIBLE_DEVICES`` (else ``CUDA_VISIBLE_DEVICES``) as indices into
what ROCR left, or UUIDs; an empty value hides every GPU, a list stops at its first entry that
names nothing, a repeated entry counts once.

Use on a shared box: ``/sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>`` is each process's memory on
each GPU (what ``amd-smi process`` shows), ``/sys/class/drm/renderD<N>/device/gpu_busy_percent``
the GPU's utilisation. Initialised HIP: ROCr keeps ``/dev/kfd`` open from ``hsa_init`` on, so an
open ``/dev/kfd`` in ``/proc/self/fd`` says this process initialised it (loading
``libamdhip64``, which every ROCm torch does on import, does not open it).

Example:
    >>> machine_gpus()  # no AMD GPU on this machine
    []
    >>> hip_initialised()
    False
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nbaccel.devices import sysfs
from nbaccel.devices.gpu_use import DeviceUse

_TOPOLOGY = ("sys", "class", "kfd", "kfd", "topology", "nodes")
_PROCESSES = ("sys", "class", "kfd", "kfd", "proc")


@dataclass(frozen=True)
class AmdGpu:
    """One AMD GPU as the KFD topology lists it; ``index`` is its place among the machine's GPUs."""

    index: int
    gpu_id: int  # KFD's id: names the GPU in /sys/class/kfd/kfd/proc/<pid>/vram_<gpu_id>
    name: str  # the ISA ("gfx90a"); the marketing name is not in the topology
    uuid: str  # "GPU-<unique id in hex>", as ROCR_VISIBLE_DEVICES accepts it
    render_minor: int | None  # /dev/dri/renderD<minor>
    vram_total: int | None  # bytes


def machine_gpus() -> list[AmdGpu]:
    """Every AMD GPU of this machine in ROCr's order (empty without the amdgpu driver)."""
    folder = sysfs.path(*_TOPOLOGY)
    try:
        nodes = sorted(int(n) for n in os.listdir(folder) if n.isdigit())
    except OSError:
        return []
    gpus: list[AmdGpu] = []
    for node in nodes:
        gpu = _describe(folder / str(node), len(gpus))
        if gpu is not None:
            gpus.append(gpu)
    return gpus


def _describe(node: Path, index: int) -> AmdGpu | None:
    gpu_id = _int(sysfs.read_text(node / "gpu_id"))
    if not gpu_id:  # a CPU node (gpu_id 0), or a node being torn down
        return None
    properties = _properties(sysfs.read_text(node / "properties") or "")
    unique = properties.get("unique_id")
    minor = properties.get("drm_render_minor")
    total = _int(sysfs.read_text(_render_device(minor) / "mem_info_vram_total")) if minor is not None else None
    return AmdGpu(index, gpu_id, sysfs.read_text(node / "name") or "", f"GPU-{unique:016x}" if unique else "", minor, total)


def _properties(text: str) -> dict[str, int]:
    found = {}
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        number = _int(value)
        if key and number is not None:
            found[key] = number
    return found


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _render_device(minor: int) -> Path:
    return sysfs.path("sys", "class", "drm", f"renderD{minor}", "device")


def _pick(gpus: Sequence[AmdGpu], value: str | None) -> list[AmdGpu]:
    """``gpus`` narrowed by one visibility variable (None: unset, all of them)."""
    if value is None:
        return list(gpus)
    chosen: list[AmdGpu] = []
    for raw in value.split(","):
        entry = raw.strip()
        match = re.fullmatch(r"\d+", entry)
        if match:
            gpu = gpus[int(entry)] if int(entry) < len(gpus) else None
        else:
            named = [g for g in gpus if g.uuid and entry.lower().startswith("gpu-") and g.uuid.lower().startswith(entry.lower())]
            gpu = named[0] if len(named) == 1 else None
        if gpu is None:  # the runtime stops at the first entry that names nothing
            break
        if gpu not in chosen:
            chosen.append(gpu)
    return chosen


def visible(gpus: Sequence[AmdGpu], environ: Mapping[str, str] | None = None) -> list[AmdGpu]:
    """The GPUs HIP shows this process, in its order: ROCR's list, then HIP's (or CUDA's) within it.

    >>> gpus = [AmdGpu(i, 10 + i, "gfx942", f"GPU-{i:016x}", 128 + i, None) for i in range(4)]
    >>> [g.index for g in visible(gpus, {"ROCR_VISIBLE_DEVICES": "1,3", "HIP_VISIBLE_DEVICES": "1"})]
    [3]
    >>> [g.index for g in visible(gpus, {"CUDA_VISIBLE_DEVICES": "2,0"})], visible(gpus, {"HIP_VISIBLE_DEVICES": ""})
    ([2, 0], [])
    """
    env = os.environ if environ is None else environ
    after_rocr = _pick(gpus, env.get("ROCR_VISIBLE_DEVICES"))
    hip = env.get("HIP_VISIBLE_DEVICES")
    return _pick(after_rocr, hip if hip is not None else env.get("CUDA_VISIBLE_DEVICES"))


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[AmdGpu]:
    """The AMD GPUs this process may use, in HIP's order."""
    return visible(machine_gpus(), environ)


def hip_variable(environ: Mapping[str, str] | None = None) -> str:
    """Which variable names the devices at HIP's level here: the ranks' choice is written in it."""
    env = os.environ if environ is None else environ
    return "HIP_VISIBLE_DEVICES" if "HIP_VISIBLE_DEVICES" in env or "CUDA_VISIBLE_DEVICES" not in env else "CUDA_VISIBLE_DEVICES"


def kfd_device() -> Path:
    """The KFD device node (``/dev/kfd`` under the root)."""
    return sysfs.path("dev", "kfd")


def hip_initialised() -> bool:
    """True when this process holds ``/dev/kfd`` open: ROCr (under HIP) was initialised here.

    One ``stat`` on a machine without the amdgpu driver; otherwise a read of ``/proc/self/fd``.
    """
    device = kfd_device()
    return device.exists() and bool(sysfs.open_device_files({device}))


def process_vram(gpu_ids: Iterable[int]) -> dict[int, dict[int, int]]:
    """gpu_id -> {pid: bytes of that GPU's memory the process holds}, for every process KFD lists."""
    wanted = set(gpu_ids)
    found: dict[int, dict[int, int]] = {gpu: {} for gpu in wanted}
    folder = sysfs.path(*_PROCESSES)
    try:
        pids = [int(p) for p in os.listdir(folder) if p.isdigit()]
    except OSError:
        return found
    for pid in pids:
        for gpu in wanted:
            held = _int(sysfs.read_text(folder / str(pid) / f"vram_{gpu}"))
            if held:
                found[gpu][pid] = held
    return found


def utilisation(gpu: AmdGpu) -> int | None:
    """The GPU's busy percentage (amdgpu's ``gpu_busy_percent``); None where it does not say."""
    if gpu.render_minor is None:
        return None
    return _int(sysfs.read_text(_render_device(gpu.render_minor) / "gpu_busy_percent"))


def vram_used(gpu: AmdGpu) -> int | None:
    """Bytes of the GPU's memory in use, by every process (amdgpu's ``mem_info_vram_used``)."""
    if gpu.render_minor is None:
        return None
    return _int(sysfs.read_text(_render_device(gpu.render_minor) / "mem_info_vram_used"))


class AmdGpuUse:
    """``nbaccel.devices.gpu_use.GpuUse``'s counterpart for ranks on AMD GPUs: their memory from
    KFD's per-process files, each GPU's utilisation from amdgpu's ``gpu_busy_percent``."""

    def __init__(self, gpus: dict[int, AmdGpu], devices: dict[int, int]) -> None:
        self._gpus = gpus  # gpu_id -> the GPU
        self.devices = devices  # rank -> gpu_id

    @classmethod
    def open(cls, hip_indices: Mapping[int, int]) -> AmdGpuUse | None:
        """For ranks on AMD GPUs (rank -> its ``cuda:N`` as this process's variables name it);
        None where no rank is on one this process can see."""
        shown = visible_gpus() if hip_indices else []
        devices = {rank: shown[index].gpu_id for rank, index in hip_indices.items() if 0 <= index < len(shown)}
        return cls({g.gpu_id: g for g in shown}, devices) if devices else None

    def sample(self, ranks: Iterable[int]) -> dict[int, DeviceUse]:
        """gpu_id -> its use now, for the GPUs of ``ranks`` (each GPU read once)."""
        wanted = {self.devices[rank] for rank in ranks if rank in self.devices}
        held = process_vram(wanted)
        return {gpu: DeviceUse(held.get(gpu, {}), utilisation(self._gpus[gpu])) for gpu in wanted}
