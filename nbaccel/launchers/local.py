"""One-node launches: a private loopback rendezvous, one process per rank, one supervisor loop."""

from __future__ import annotations

import os
import signal

from ..env import rank_environment
from ..outcome import RankOutcome
from ..output.relay import RankPipes, close_child_ends, open_rank_pipes
from ..output.sinks import Sink
from ..process import RankProcess
from ..rendezvous import LoopbackRendezvous
from ..supervisor import Supervisor
from ..worker import Job
from .base import LaunchPlan, Launcher, RankStarter


class LocalLauncher(Launcher):
    """Starts every rank on this machine with ``starter`` (fork or spawn) and supervises them.

    Example::

        outcomes = LocalLauncher(ForkStarter()).run_attempt(job, plan, attempt=0, sink=TextSink())
    """

    def __init__(self, starter: RankStarter) -> None:
        self.starter = starter
        self.start_method = starter.start_method

    def run_attempt(self, job: Job, plan: LaunchPlan, attempt: int, sink: Sink) -> list[RankOutcome]:
        rendezvous = LoopbackRendezvous(plan.master_addr, plan.port)
        processes: list[RankProcess] = []
        pipes: list[RankPipes] = []
        try:
            sink.launch_started(plan.num_processes, attempt)
            for rank in range(plan.num_processes):
                env = rank_environment(
                    rank=rank,
                    world_size=plan.num_processes,
                    master_addr=rendezvous.address,
                    master_port=rendezvous.port,
                    device_type=plan.device_type,
                    mixed_precision=plan.mixed_precision,
                    restart_count=attempt,
                    max_restarts=plan.max_restarts,
                    visible_gpus=plan.gpus,
                )
                processes.append(self._start_rank(job, rank, env, pipes, rendezvous))
            # Started after the forks: the ranks are already running while the store comes up,
            # and no rank inherits the store's server thread state.
            rendezvous.start_store(plan.num_processes)
            return Supervisor(processes, pipes, sink, plan.deadline, plan.timeout).run()
        except BaseException:
            _kill_and_reap(processes)
            raise
        finally:
            rendezvous.close()
            for p in pipes:
                p.close()
            for proc in processes:
                proc.close()

    def _start_rank(self, job: Job, rank: int, env: dict[str, str], pipes: list[RankPipes], rendezvous: LoopbackRendezvous) -> RankProcess:
        parent_ends, child_ends = open_rank_pipes(rank)
        pipes.append(parent_ends)
        # The rank must not hold the kernel's ends of any rank's pipes (EOF would never come),
        # nor the rendezvous socket (the port would outlive the launch).
        inherited = [fd for p in pipes for fd in p.fds]
        if rendezvous.listen_fd is not None:
            inherited.append(rendezvous.listen_fd)
        try:
            pid = self.starter.start(job, rank, env, child_ends, inherited)
        finally:
            close_child_ends(child_ends)
        return RankProcess(rank, pid)


def _kill_and_reap(processes: list[RankProcess]) -> None:
    """Last resort when the launch itself broke: nothing we started may outlive it."""
    for proc in processes:
        proc.send(signal.SIGKILL)
    for proc in processes:
        if proc.wait(timeout=5.0) is None:
            try:
                os.waitpid(proc.pid, 0)
            except ChildProcessError:
                pass
