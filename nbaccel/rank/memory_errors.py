"""An out-of-memory error raised in a rank, worded with the rank, the device and the peak.

Python's ``MemoryError`` (an allocation refused: ``RLIMIT_AS``, a full machine without overcommit)
usually has no message at all, and CUDA's ``OutOfMemoryError`` names no rank. Before the error
leaves the rank, ``note(exc)`` adds what only the rank knows: its peak resident memory
(``getrusage``) against its address-space limit, or on a GPU the device, its peak reserved memory
and its capacity.

Example:
    >>> note(ValueError("not memory")) is None
    True
    >>> note(MemoryError()).startswith("out of memory on rank 0: peak ")
    True
"""

from __future__ import annotations

import os
import sys

from nbaccel.wire.sizes import gib


def note(exc: BaseException) -> str | None:
    """The words to add to ``exc``'s message when it is an out-of-memory error, else None."""
    rank = os.environ.get("RANK", "0")
    torch = sys.modules.get("torch")
    cuda_oom = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None) if torch is not None else None
    if cuda_oom is not None and isinstance(exc, cuda_oom):
        return f"out of memory on rank {rank}, {_device_words(torch)}"
    if isinstance(exc, MemoryError):
        import resource  # POSIX only (a rank runs on Linux); importing nbaccel works anywhere

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        limit = f" of its address-space limit {gib(soft)} (RLIMIT_AS)" if soft != resource.RLIM_INFINITY else ""
        return f"out of memory on rank {rank}: peak {gib(peak)} resident{limit}"
    return None


def _device_words(torch: object) -> str:
    cuda = torch.cuda  # type: ignore[attr-defined]
    try:
        device = cuda.current_device()
        total = cuda.get_device_properties(device).total_memory
        return f"cuda:{device} ({cuda.get_device_name(device)}): peak {gib(cuda.max_memory_reserved(device))} reserved of {gib(total)}"
    except Exception:  # noqa: BLE001 - a broken CUDA context after the error: the rank still reports it
        return "on its GPU"
