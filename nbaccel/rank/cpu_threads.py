"""Each rank uses its share of the CPU cores, not all of them (rank side).

A forked rank inherits the kernel's torch thread pool, sized for the whole machine, so N ranks on
one machine run N pools of every core each and fight for them. Measured on 2 cores with 2 DDP
ranks (benchmarks/training_bench.py): 74 steps/s with 2 threads per rank, 328 with 1. torchrun
exports ``OMP_NUM_THREADS=1`` for several ranks; Accelerate sets cores // local ranks for
MULTI_CPU (and warns on every rank that it did). nbaccel gives each rank the cores this process
may run on divided by the ranks on this machine, at least one, unless ``OMP_NUM_THREADS`` is set
already (the user's choice is kept). The variable is exported too, so a rank that imports torch
only later, the rank's own subprocesses and Accelerate's check all see the same number.

Example (what the bootstrap does in a rank)::

    share_cores(local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]))
    torch.get_num_threads()  # 1 on a 2-core machine with 2 ranks
"""

from __future__ import annotations

import os
import sys

from nbaccel.wire.rank_env import OMP_NUM_THREADS, ONE_THREAD_VARIABLE, planned_threads, threads_per_rank

__all__ = ["OMP_NUM_THREADS", "ONE_THREAD_VARIABLE", "hold_to_one_thread", "planned_threads", "share_cores", "threads_per_rank"]


def share_cores(local_world_size: int, exported: int | None = None, one_thread: bool = False) -> None:
    """Size this rank's torch pool (now, or when torch is imported) for ``local_world_size`` ranks.

    ``exported``: the ``OMP_NUM_THREADS`` the parent already put in this rank's environment
    (``planned_threads``), 0 when it decided the rank keeps its own; ``one_thread``: the parent's
    OpenMP pool had started. Without them (a spawned rank, a fork server's) the rank decides.
    """
    if exported is not None:
        if one_thread:
            hold_to_one_thread(export=False)
        elif exported:
            _size_torch(exported)
        return
    if os.environ.get(ONE_THREAD_VARIABLE):
        hold_to_one_thread()
        return
    if os.environ.get(OMP_NUM_THREADS):
        return
    threads = threads_per_rank(local_world_size)
    os.environ[OMP_NUM_THREADS] = str(threads)
    _size_torch(threads)


def _size_torch(threads: int) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != threads:
        torch.set_num_threads(threads)


def hold_to_one_thread(export: bool = True) -> None:
    """One CPU thread in this forked rank, and ``torch.set_num_threads(n)`` kept at 1 (said once).

    The user's own ``torch.set_num_threads(8)`` would otherwise reach the kernel's dead libgomp
    pool and hang; it is answered with one line on stderr instead. ``export``: set
    ``OMP_NUM_THREADS=1`` too (False where the parent put it in the environment block already).
    """
    if export:
        os.environ[OMP_NUM_THREADS] = "1"
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch.set_num_threads, "_nbaccel_held", False):
        return
    original = torch.set_num_threads
    original(1)
    told: list[bool] = []

    def set_num_threads(threads: int) -> None:
        if threads > 1 and not told:
            told.append(True)
            print(
                f"nbaccel: torch.set_num_threads({threads}) kept at 1: this rank was forked from a kernel whose OpenMP pool had started, and more threads would hang (start_method='spawn' allows them).",
                file=sys.stderr,
                flush=True,
            )
        original(1)

    set_num_threads._nbaccel_held = True  # type: ignore[attr-defined]
    torch.set_num_threads = set_num_threads  # type: ignore[attr-defined]
