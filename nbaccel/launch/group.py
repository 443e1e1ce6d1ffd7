"""A group of rank processes on this machine: a private loopback rendezvous, pipes, and pids.

Used for one attempt of a one-shot launch and for the lifetime of a persistent worker pool.

Example::

    group = RankGroup.start(starter, job, plan, attempt=0)
    try:
        ...  # watch group.processes and group.pipes
    finally:
        group.close()  # SIGKILLs and reaps whatever is still running
"""

from __future__ import annotations

import gc
import os
import signal

from nbaccel.launch.rank_env import rank_environment
from nbaccel.launch.pipes import RankPipes, close_child_ends, open_rank_pipes
from nbaccel.launch.processes import RankProcess
from nbaccel.launch.rendezvous import LoopbackRendezvous
from nbaccel.launch.loop import RankWatch
from nbaccel.rank.bootstrap import Job
from nbaccel.launch.seam import LaunchPlan, RankStarter


class RankGroup:
    """Every rank process of one attempt, with the kernel's ends of their pipes."""

    def __init__(self, rendezvous: LoopbackRendezvous) -> None:
        self.rendezvous = rendezvous
        self.processes: list[RankProcess] = []
        self.pipes: list[RankPipes] = []

    @classmethod
    def start(cls, starter: RankStarter, job: Job, plan: LaunchPlan, attempt: int, with_commands: bool = False, store_now: bool = True) -> RankGroup:
        """Start ``plan.num_processes`` ranks running ``job``; on any failure nothing is left behind.

        With ``store_now=False`` the rendezvous store is left to the caller to start (see
        ``start_store_on_first_connection``): most short functions never make a process group.
        """
        group = cls(LoopbackRendezvous(plan.master_addr, plan.port))
        # Frozen objects are never scanned by a rank's garbage collector, so the kernel's heap
        # stays shared instead of being copied page by page into every rank (copy-on-write).
        gc.freeze()
        try:
            for rank in range(plan.num_processes):
                env = rank_environment(
                    rank=rank,
                    world_size=plan.num_processes,
                    master_addr=group.rendezvous.address,
                    master_port=group.rendezvous.port,
                    device_type=plan.device_type,
                    mixed_precision=plan.mixed_precision,
                    restart_count=attempt,
                    max_restarts=plan.max_restarts,
                    visible_gpus=plan.gpus,
                )
                group._start_rank(starter, job, rank, env, with_commands)
            # Started after the forks: the ranks are already starting up while the store comes up
            # (early connections wait in the socket's backlog).
            if store_now:
                group.rendezvous.start_store(plan.num_processes)
        except BaseException:
            group.close()
            raise
        finally:
            gc.unfreeze()  # only the ranks keep them frozen; the kernel collects as before
        return group

    def _start_rank(self, starter: RankStarter, job: Job, rank: int, env: dict[str, str], with_commands: bool) -> None:
        parent_ends, child_ends = open_rank_pipes(rank, with_commands)
        self.pipes.append(parent_ends)
        # The rank must not hold the kernel's ends of any rank's pipes (EOF would never come),
        # nor the rendezvous socket (the port would outlive the launch).
        inherited = [fd for p in self.pipes for fd in p.all_fds]
        if self.rendezvous.listen_fd is not None:
            inherited.append(self.rendezvous.listen_fd)
        try:
            pid = starter.start(job, rank, env, child_ends, inherited)
        finally:
            close_child_ends(child_ends)
        self.processes.append(RankProcess(rank, pid))

    def start_store_on_first_connection(self, watch: RankWatch) -> None:
        """Start the store only when a rank first connects to it (it costs milliseconds)."""
        fd = self.rendezvous.listen_fd
        if fd is None:
            return

        def start() -> None:
            watch.remove_reader(fd)  # before the store takes the socket over
            self.rendezvous.start_store(len(self.processes))

        watch.add_reader(fd, start)

    def kill(self) -> None:
        """SIGKILL every rank not yet reaped, and reap it."""
        for proc in self.processes:
            proc.send(signal.SIGKILL)
        for proc in self.processes:
            if proc.wait(timeout=5.0) is None:
                try:  # uninterruptible sleep (a wedged driver call): wait it out rather than leak
                    os.waitpid(proc.pid, 0)
                except ChildProcessError:
                    pass

    def close(self) -> None:
        """Kill what still runs, then free the port, the pipes and the pidfds."""
        self.kill()
        self.rendezvous.close()
        for pipes in self.pipes:
            pipes.close()
        for proc in self.processes:
            proc.close()
