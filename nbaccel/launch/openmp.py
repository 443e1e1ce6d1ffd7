"""Has this process started a GNU OpenMP (libgomp) thread pool? Then a forked child hangs in it.

torch's CPU kernels run on libgomp, which is not fork-safe: once a parallel region ran, the pool's
worker threads exist in the parent only, and a forked child's first parallel region with more
than one thread waits for them forever (measured here: the kernel runs ``torch.ones(2**26).sum()``
on 2 threads; a forked rank's ``(torch.ones(2**26) * 2).sum()`` after ``set_num_threads(2)``
never returns; with one thread it does, since a one-thread region uses no pool).

The pool's workers are found by where they wait: an idle libgomp worker sleeps in ``futex``
issued by libgomp's own inline ``syscall`` instruction, so ``/proc/self/task/<tid>/syscall``
shows an instruction pointer inside libgomp's code (read from ``/proc/self/maps``). Other native
threads (OpenBLAS, ZeroMQ, CUDA's) wait inside libc or their own library. A worker still spinning
right after a region shows ``running``: it is asked again briefly, and one that keeps running is
counted as a worker (forking with one thread is slower, never stuck). Python's own threads are
skipped. About 20 to 40 µs a call once libgomp's address range is known (docs/gpu.md).

Example:
    >>> openmp_pool_started()  # a process that ran no multi-threaded torch op
    False
"""

from __future__ import annotations

import os
import threading
import time

_RETRIES = 5
_RETRY_WAIT = 0.002  # libgomp spins ~300 000 rounds (about a millisecond) before it sleeps


def openmp_pool_started() -> bool:
    """True when a libgomp worker thread exists in this process (a fork would inherit a dead pool)."""
    code = _libgomp_code()
    if not code:
        return False
    for attempt in range(_RETRIES + 1):
        verdict = _any_worker(code)
        if verdict is not None:
            return verdict
        if attempt < _RETRIES:
            time.sleep(_RETRY_WAIT)
    return True  # a native thread kept running all along: it may be a spinning worker


_found_code: list[tuple[int, int]] = []


def _libgomp_code() -> list[tuple[int, int]]:
    """The address ranges of libgomp's executable code in this process (empty: not loaded).

    Remembered once found: a loaded libgomp is never unloaded (torch keeps it), and reading
    ``/proc/self/maps`` of a process with torch costs about 0.6 ms.
    """
    if _found_code:
        return _found_code
    ranges = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                if "libgomp" in line and " r-xp " in line:
                    low, high = line.split(" ", 1)[0].split("-")
                    ranges.append((int(low, 16), int(high, 16)))
    except OSError:
        return []
    _found_code.extend(ranges)
    return ranges


def _any_worker(code: list[tuple[int, int]]) -> bool | None:
    """True: a thread waits inside libgomp; False: none does; None: a native thread is running."""
    python_threads = {t.native_id for t in threading.enumerate()}
    running = False
    for tid in _task_ids():
        if tid in python_threads:
            continue
        pc = _waiting_at(tid)
        if pc is None:
            running = True
        elif any(low <= pc < high for low, high in code):
            return True
    return None if running else False


def _task_ids() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _waiting_at(tid: int) -> int | None:
    """The user-space instruction pointer where ``tid`` sits in a system call; None while running.

    A thread that has gone meanwhile reads as waiting nowhere (0).
    """
    try:  # os-level calls, not open(): asked of every native thread before every launch
        fd = os.open(f"/proc/self/task/{tid}/syscall", os.O_RDONLY | os.O_CLOEXEC)
        try:
            fields = os.read(fd, 512).split()
        finally:
            os.close(fd)
    except FileNotFoundError:
        return 0
    except OSError:  # unreadable (a locked-down /proc): cannot tell, so assume the worst
        return None
    if not fields or fields[0] == b"running" or len(fields) < 3:
        return None
    return int(fields[-1], 16)
