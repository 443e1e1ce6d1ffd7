"""Start a rank by forking the kernel: fast, and functions defined in the notebook just work."""

from __future__ import annotations

import os
import warnings

from nbaccel.launch.processes import RankProcess
from nbaccel.rank.bootstrap import prepare_environment, run_rank
from nbaccel.rank.cpu_threads import ONE_THREAD_VARIABLE
from nbaccel.wire.job import ChildEnds, Job


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
        prepared = prepare_environment(env)  # here, not in the child: see PreparedEnvironment
        with warnings.catch_warnings():
            # Python 3.12+ warns that forking a threaded process may deadlock the child. The rank
            # only touches fork-safe state before replacing stdio (preflight refuses CUDA).
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:
            run_rank(job, rank, env, ends, close_fds, parent, prepared)
        try:  # also done in the child; doing it here too closes the race with an early signal
            os.setpgid(pid, pid)
        except OSError:
            pass
        return pid
