"""Each local rank's CPU use, resident memory and GPU use, sampled about once a second from the loop's clock.

No thread: the event loop (``nbaccel.launch.loop``) asks ``due()`` when it next wants waking and
calls ``sample(now)`` when that moment has passed. Each sample reads ``/proc/<pid>/stat`` (user and
system time) and ``/proc/<pid>/statm`` (resident pages) of every rank process of this node: about
50 us a rank (``benchmarks/profile_bench.py``), far under 1% of one core at 1 Hz. Ranks on CUDA
(``gpus``: rank -> its ``cuda:N``) add their device memory and their GPU's utilisation, asked of
NVML (``nbaccel.devices.gpu_use``: never the CUDA driver); without NVML, or for CPU ranks, nothing
is asked. It keeps each rank's peaks, which the loop gives to the rank's outcome when it exits
(an OOM kill is named by them: ``nbaccel.launch.memory_limit``).

Example:
    >>> import os
    >>> sampler = ResourceSampler({0: os.getpid()}, now=0.0)
    >>> sampler.due()
    1.0
    >>> sample = sampler.sample(1.0)[0]
    >>> sample["rss"] > 0 and sample["peak_rss"] >= sample["rss"] and sample["cpu"] >= 0
    True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nbaccel.devices.gpu_use import DeviceUse
from nbaccel.devices.inventory import open_use
from nbaccel.launch.memory_limit import NEAR_LIMIT, memory_cgroup, memory_limit, oom_kills, oom_words

PERIOD = 1.0  # seconds between samples
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class ResourceSampler:
    """Samples ``pids`` (rank -> pid of a process on this node) every ``PERIOD`` seconds;
    ``gpus`` (rank -> CUDA index, as this process sees them) for ranks on a GPU of ``vendor``
    (``"nvidia"``: NVML; ``"amd"``: KFD's files)."""

    def __init__(self, pids: Mapping[int, int], now: float, period: float = PERIOD, gpus: Mapping[int, int] | None = None, vendor: str = "nvidia") -> None:
        self.pids = dict(pids)
        self.period = period
        self.peaks: dict[int, int] = {}  # rank -> most resident bytes seen
        self.gpu_peaks: dict[int, int] = {}  # rank -> most device memory seen
        self.gpu = open_use(vendor, {rank: index for rank, index in (gpus or {}).items() if rank in self.pids})
        self.latest: dict[int, dict[str, Any]] = {}
        self._cgroups: dict[int, Path | None] = {}  # rank -> its memory cgroup, as last seen
        self._oom_before: dict[Path, int] = {}  # cgroup -> OOM kills when first seen
        self._cpu: dict[int, tuple[float, int]] = {rank: (now, _cpu_ticks(pid)) for rank, pid in self.pids.items()}
        self._next = now + period
        for rank, pid in self.pids.items():
            self._watch_cgroup(rank, pid)

    def due(self) -> float:
        """The monotonic moment of the next sample."""
        return self._next

    def sample(self, now: float, ranks: list[int] | None = None) -> dict[int, dict[str, Any]]:
        """Sample ``ranks`` (default all) now: rank -> ``{"cpu": %, "rss": bytes, "peak_rss": bytes,
        "cpu_time": seconds}`` (``cpu_time``: the user and system time the rank has used so far),
        and for a rank on a GPU ``gpu_mem`` (bytes; None when NVML cannot tell), ``peak_gpu_mem``
        and ``gpu_util`` (percent, None when NVML does not say).

        A process that has ended is skipped (its peak stays), a zombie and an exiting one too: an
        exited rank not yet reaped reads as 0 resident bytes, which is not a sample.
        """
        self._next = now + self.period
        samples = {}
        for rank in self.pids if ranks is None else [r for r in ranks if r in self.pids]:
            sample = self._sample_one(rank, now)
            if sample is not None:
                samples[rank] = self.latest[rank] = sample
        if self.gpu is not None and samples:
            self._add_gpu_use(samples)
        return samples

    def _add_gpu_use(self, samples: dict[int, dict[str, Any]]) -> None:
        assert self.gpu is not None
        uses = self.gpu.sample(samples)
        for rank, sample in samples.items():
            use = uses.get(self.gpu.devices.get(rank, -1))
            if use is None:
                continue
            held = _held(use, self.pids[rank])
            if held is not None:
                self.gpu_peaks[rank] = max(self.gpu_peaks.get(rank, 0), held)
            sample.update(gpu_mem=held, peak_gpu_mem=self.gpu_peaks.get(rank), gpu_util=use.utilisation)

    def peak(self, rank: int) -> int | None:
        """``rank``'s peak resident bytes so far, reading it once more if it still runs."""
        rss = _rss(self.pids.get(rank, 0))
        if rss is not None:
            self.peaks[rank] = max(self.peaks.get(rank, 0), rss)
        return self.peaks.get(rank)

    def out_of_memory(self, rank: int) -> str | None:
        """For a rank that died of a SIGKILL nbaccel did not send: the words when it was the OOM
        killer (its cgroup's OOM kills went up, or its peak was near the limit), else None."""
        cgroup = self._cgroups.get(rank)
        peak = self.peaks.get(rank, 0)
        limit = memory_limit(cgroup)
        counted = cgroup is not None and oom_kills(cgroup) > self._oom_before.get(cgroup, 0)
        if counted or (limit is not None and peak >= NEAR_LIMIT * limit):
            return oom_words(peak, limit)
        return None

    def _watch_cgroup(self, rank: int, pid: int) -> None:
        cgroup = memory_cgroup(pid)
        if _cpu_ticks(pid) < 0:  # it began to exit meanwhile: its cgroup may read as the root's
            return
        self._cgroups[rank] = cgroup
        if cgroup is not None and cgroup not in self._oom_before:
            self._oom_before[cgroup] = oom_kills(cgroup)

    def _sample_one(self, rank: int, now: float) -> dict[str, Any] | None:
        pid = self.pids[rank]
        rss, ticks = _rss(pid), _cpu_ticks(pid)
        if rss is None or ticks < 0:
            return None
        then, ticks_then = self._cpu.get(rank, (now, ticks))
        self._cpu[rank] = (now, ticks)
        self._watch_cgroup(rank, pid)
        elapsed = now - then
        cpu = 100.0 * (ticks - ticks_then) / _TICKS / elapsed if elapsed > 0 else 0.0
        self.peaks[rank] = max(self.peaks.get(rank, 0), rss)
        return {"cpu": round(cpu, 1), "rss": rss, "peak_rss": self.peaks[rank], "cpu_time": round(ticks / _TICKS, 2)}


def _held(use: DeviceUse, pid: int) -> int | None:
    """What ``pid`` holds on the device: its listed bytes; 0 when it is not listed and the list
    speaks of this pid namespace; None when NVML could not list or lists only pids of another
    namespace (a container's: its ranks cannot be told apart there, so nothing is guessed)."""
    if use.memory is None:
        return None
    if pid in use.memory:
        return use.memory[pid]
    if not use.memory or any(os.path.exists(f"/proc/{other}") for other in use.memory):
        return 0
    return None


def _rss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_PF_EXITING = 0x4  # the kernel's task flag (/proc/<pid>/stat field 9): the process is exiting


def _cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks; -1 when it cannot be read or the process exits or has exited."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return -1
    fields = text[text.rfind(b")") + 2 :].split()  # the command name may hold spaces: fields start after ")"
    if fields[:1] in ([b"Z"], [b"X"]):  # exited, not yet reaped: its memory is gone and its times are final
        return -1
    try:
        if int(fields[6]) & _PF_EXITING:
            # Exiting (an OOM kill's victim freeing its memory): it reads 0 resident bytes, and
            # under cgroup v1 it already shows the root cgroup, which would hide the OOM kill.
            return -1
        return int(fields[11]) + int(fields[12])
    except (ValueError, IndexError):
        return -1
