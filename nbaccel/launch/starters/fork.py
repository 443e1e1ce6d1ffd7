"""Start a rank by forking the kernel: fast, and functions defined in the notebook just work."""

from __future__ import annotations

import os
import sys
import warnings

from nbaccel.launch.processes import RankProcess
from nbaccel.rank import process_title, stack_dump
from nbaccel.rank.bootstrap import PreparedEnvironment, prepare_environment, rank_names, run_rank
from nbaccel.wire.job import ChildEnds, Job
from nbaccel.wire.rank_env import OMP_NUM_THREADS, ONE_THREAD_VARIABLE, planned_threads


class ForkStarter:
    """Forks the calling process; the child becomes the rank and never returns.

    Example::

        pid = ForkStarter().start(job, rank=0, env=env, ends=ends, close_fds=[])
    """

    start_method = "fork"

    def __init__(self, one_thread: bool = False) -> None:
        # one_thread: the kernel's OpenMP pool started, so a forked rank must never run a
        # multi-threaded region (it would wait for pool threads that exist only in the kernel).
        self.one_thread = one_thread

    def process(self, rank: int, pid: int) -> RankProcess:
        return RankProcess(rank, pid)

    def release(self) -> None:
        """Nothing to free: the ranks share the kernel's memory."""

    def start(self, job: Job, rank: int, env: dict[str, str], ends: ChildEnds, close_fds: list[int]) -> int:
        parent = os.getpid()
        if self.one_thread:
            env = {**env, ONE_THREAD_VARIABLE: "1"}
        prepared = _prepare(job, rank, env)  # here, not in the child: see PreparedEnvironment
        try:
            pid = _fork()
            if pid == 0:
                run_rank(job, rank, env, ends, close_fds, parent, prepared)
        finally:
            if prepared is not None and prepared.stack_fd is not None:
                os.close(prepared.stack_fd)  # the rank has its copy
        try:  # also done in the child; doing it here too closes the race with an early signal
            os.setpgid(pid, pid)
        except OSError:
            pass
        return pid


# Python 3.12+ warns that forking a threaded process may deadlock the child. The rank only
# touches fork-safe state before replacing stdio (preflight refuses CUDA).
_WARNS_ON_FORK = sys.version_info >= (3, 12)


def _fork() -> int:
    """``os.fork()``, without 3.12's warning about threads; on older Pythons without the
    ``catch_warnings`` either, whose exit in the child (warnings' filters put back) wrote pages."""
    if not _WARNS_ON_FORK:
        return os.fork()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


def _prepare(job: Job, rank: int, env: dict[str, str]) -> PreparedEnvironment | None:
    """What the rank would otherwise make itself, writing the kernel's pages: its environment as
    one block (with the CPU threads nbaccel gives it), its stack dump file, open, and its name."""
    threads = planned_threads(env)
    prepared = prepare_environment(env if threads is None else {**env, OMP_NUM_THREADS: str(threads)})
    if prepared is None:
        return None  # the rank sets each variable, its threads and its stack file itself
    path = env.get(stack_dump.STACK_FILE_VARIABLE)
    try:
        stack_fd = stack_dump.open_for_rank(path) if path else None
    except OSError:
        stack_fd = None  # the rank opens it, and fails there as it did
    title = process_title.encode_title(*rank_names(job, rank, env))
    return prepared._replace(threads=threads or 0, stack_fd=stack_fd, title=title)
