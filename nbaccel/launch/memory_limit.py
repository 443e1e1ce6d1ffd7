"""Was a rank killed by the out-of-memory killer? Its memory cgroup's limit and OOM-kill counter.

A rank that the kernel's OOM killer takes ends by SIGKILL, which alone says nothing about memory.
The sampler (``nbaccel.launch.sampler``) notes each rank's memory cgroup (cgroup v2 or v1's
``memory`` controller, read from ``/proc/<pid>/cgroup`` while it runs, since a rank or a job
system may move it), that cgroup's limit (``memory.max`` / ``memory.limit_in_bytes``; without
one, the machine's ``MemTotal``) and its OOM-kill counter (``memory.events`` / ``memory.oom_control``).
A rank killed by SIGKILL that nbaccel did not send is called an OOM kill when that counter went
up meanwhile, or when its peak was near the limit (90%: a sample a second can miss the last
growth).

Example:
    >>> import os
    >>> limit = memory_limit(memory_cgroup(os.getpid()))
    >>> limit is None or limit > 0
    True
    >>> oom_words(peak=int(21.3 * 2**30), limit=24 * 2**30)
    'killed by the out-of-memory killer (peak 21.3 GiB of 24.0 GiB)'
"""

from __future__ import annotations

from pathlib import Path

from nbaccel.wire.sizes import gib

_ROOTS_V1 = ("/sys/fs/cgroup/memory",)
_ROOTS_V2 = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
_NO_LIMIT = 2**60  # v1 writes "no limit" as a page-rounded 2**63
NEAR_LIMIT = 0.9


def memory_cgroup(pid: int) -> Path | None:
    """The folder of ``pid``'s memory cgroup, or None (no cgroups, or the process is gone)."""
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return _existing(_ROOTS_V1, path)
        if controllers == "":
            v2 = path
    return _existing(_ROOTS_V2, v2, "memory.max") if v2 is not None else None


def _existing(roots: tuple[str, ...], path: str, marker: str | None = None) -> Path | None:
    for root in roots:
        folder = Path(root + path.rstrip("/")) if path != "/" else Path(root)
        if folder.is_dir() and (marker is None or (folder / marker).exists()):
            return folder
    return None


def memory_limit(cgroup: Path | None) -> int | None:
    """The cgroup's memory limit in bytes, else the machine's memory (``MemTotal``); None if unknown."""
    for name in ("memory.max", "memory.limit_in_bytes"):
        value = _read_int(cgroup / name) if cgroup is not None else None
        if value is not None and value < _NO_LIMIT:
            return value
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def oom_kills(cgroup: Path | None) -> int:
    """How many processes the OOM killer took in ``cgroup`` so far (0 when unknown)."""
    for name in ("memory.events", "memory.oom_control"):
        try:
            text = (cgroup / name).read_text() if cgroup is not None else ""
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
    return 0


def oom_words(peak: int, limit: int | None) -> str:
    """``killed by the out-of-memory killer (peak 21.3 GiB of 24.0 GiB)``."""
    of = f" of {gib(limit)}" if limit else ""
    return f"killed by the out-of-memory killer (peak {gib(peak)}{of})"


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):  # "max" (v2 without a limit) is no number either
        return None


__all__ = ["NEAR_LIMIT", "gib", "memory_cgroup", "memory_limit", "oom_kills", "oom_words"]
