"""The ranks of one node, started by the kernel: a private loopback rendezvous, pipes, and pids.

A ``LocalRankGroup`` serves one attempt of a one-shot launch and the lifetime of a persistent
worker pool alike. It is the ``RankGroup`` the one-node ``LocalGroupStarter`` hands to the event loop:
its sources are each rank's stdout, stderr and event pipes and its pidfd.

Example::

    group = LocalRankGroup.start(ForkStarter(), job, plan, attempt=0, persistent=False)
    try:
        EventLoop(group, sink, OneShot()).run()
    finally:
        group.close()  # SIGKILLs and reaps whatever is still running
"""

from __future__ import annotations

import functools
import gc
import os
import signal
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from nbaccel.launch.pipes import RankPipes, close_child_ends, open_rank_pipes
from nbaccel.launch.processes import RankProcess
from nbaccel.launch.rendezvous import LoopbackRendezvous
from nbaccel.launch.seam import LaunchPlan, RankStarter
from nbaccel.launch.stacks import STACK_FILE_VARIABLE, RankStack, StackFiles
from nbaccel.wire import events, shm
from nbaccel.wire.job import Job
from nbaccel.wire.rank_env import rank_environment

if TYPE_CHECKING:
    from nbaccel.launch.loop import EventLoop
    from nbaccel.launch.node_world import NodeWorld

_NO_PIDFD_POLL = 0.02  # only where the OS has no pidfd: how often exits are looked for
_STORE_ORDER = (-1, 0)  # a rank connecting to the store is served before any rank's output


class Rendezvous(Protocol):
    """Where the ranks' store is: the group's own ``LoopbackRendezvous``, or a ``num_nodes``
    launch's store (``nbaccel.launch.node_world``), which the launch owns and the group only names."""

    address: str
    port: int

    @property
    def listen_fd(self) -> int | None: ...

    @property
    def store_started(self) -> bool: ...

    @property
    def child_closes(self) -> tuple[int, ...]: ...

    def start_store(self, world_size: int, timeout: float = 300.0) -> None: ...

    def close(self) -> None: ...


class LocalRankGroup:
    """Every rank process of one attempt (or one pool), with the kernel's ends of their pipes."""

    def __init__(self, rendezvous: Rendezvous, stack_files: StackFiles, world: NodeWorld | None = None) -> None:
        self.rendezvous = rendezvous
        self.world = world  # this node's place in a num_nodes launch; None: the ranks are the whole world
        self.stack_files = stack_files
        self.processes: list[RankProcess] = []
        self.pipes: list[RankPipes] = []
        self._loop: EventLoop | None = None
        self._ended_streams: set[int] = set()  # fds at end of file: never watched again
        self.gpus: tuple[int, ...] = ()  # the plan's GPUs, one a rank (none on CPU ranks)
        self.gpu_vendor = ""  # whose tools sample them (nbaccel.launch.loop.sampler_for)

    @property
    def num_processes(self) -> int:
        return len(self.processes)

    @classmethod
    def start(cls, starter: RankStarter, job: Job, plan: LaunchPlan, attempt: int, persistent: bool, world: NodeWorld | None = None) -> LocalRankGroup:
        """Start ``plan.num_processes`` ranks running ``job``; on any failure nothing is left behind.

        A one-shot group starts its rendezvous store only when a rank first connects to it (most
        short functions never make a process group, and the store costs milliseconds); a
        persistent one at once, since its ranks join their group before saying READY. With a
        ``world`` (a ``num_nodes`` launch) the ranks use that launch's store instead.
        """
        rendezvous: Rendezvous = world.rendezvous if world is not None else LoopbackRendezvous(plan.master_addr, plan.port)
        group = cls(rendezvous, StackFiles(), world)
        group.gpus = tuple(plan.gpus or ()) if plan.device_type != "cpu" else ()
        group.gpu_vendor = plan.gpu_vendor
        # Frozen objects are never scanned by a rank's garbage collector, so the kernel's heap
        # stays shared instead of being copied page by page into every rank (copy-on-write).
        gc.freeze()
        try:
            try:
                for rank in range(plan.num_processes):
                    env = _environment(plan, group.rendezvous, rank, attempt, world)
                    env[STACK_FILE_VARIABLE] = group.stack_files.path(rank)
                    group._start_rank(starter, job, rank, env)
                if persistent:  # after the forks: the ranks are starting while the store comes up
                    group.rendezvous.start_store(plan.num_processes)
            finally:
                gc.unfreeze()  # only the ranks keep them frozen; the kernel collects as before
                starter.release()
        except BaseException:  # an interrupt too, wherever it lands (unfreezing takes a while): no rank is left
            group.close()
            raise
        return group

    def _start_rank(self, starter: RankStarter, job: Job, rank: int, env: dict[str, str]) -> None:
        parent_ends, child_ends = open_rank_pipes(rank, with_commands=True, with_shared=True)
        self.pipes.append(parent_ends)
        # The rank must not hold the kernel's ends of any rank's pipes (EOF would never come),
        # nor the rendezvous socket (the port would outlive the launch).
        inherited = [fd for p in self.pipes for fd in p.all_fds]
        inherited += [p.shared.sock.fileno() for p in self.pipes if p.shared is not None]
        if self.rendezvous.listen_fd is not None:
            inherited.append(self.rendezvous.listen_fd)
        inherited += self.rendezvous.child_closes
        try:
            pid = starter.start(job, rank, env, child_ends, inherited)
        finally:
            close_child_ends(child_ends)
        self.processes.append(starter.process(rank, pid))

    # -- feeding the loop ------------------------------------------------------------------------

    def attach(self, loop: EventLoop) -> None:
        self._loop = loop
        if self.rendezvous.listen_fd is not None and not self.rendezvous.store_started:
            loop.add_reader(self.rendezvous.listen_fd, self._start_store, _STORE_ORDER)
        for proc, pipes in zip(self.processes, self.pipes, strict=True):
            if proc.returncode is not None:
                continue
            sources = ((pipes.channel, self._on_events), (pipes.stdout, self._on_stdout), (pipes.stderr, self._on_stderr), (proc.pidfd, self._on_pidfd))
            for order, (fd, handler) in enumerate(sources):
                if fd is not None and fd not in self._ended_streams:
                    loop.add_reader(fd, functools.partial(handler, proc.rank), (proc.rank, order))

    def detach(self, loop: EventLoop) -> None:
        self._loop = None

    def poll(self) -> float | None:
        """Where the OS has no pidfd, look for ranks that ended; None when pidfds tell us."""
        waiting = False
        for proc in self.processes:
            if proc.pidfd is None and proc.returncode is None:
                if proc.poll() is not None:
                    self._on_pidfd(proc.rank)
                else:
                    waiting = True
        return _NO_PIDFD_POLL if waiting else None

    def _start_store(self) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self.rendezvous.listen_fd)  # type: ignore[arg-type]  # before the store takes it
        self.rendezvous.start_store(self.num_processes)

    def _on_stdout(self, rank: int) -> None:
        self._read_stream(rank, self.pipes[rank].stdout, "stdout")

    def _on_stderr(self, rank: int) -> None:
        self._read_stream(rank, self.pipes[rank].stderr, "stderr")

    def _read_stream(self, rank: int, fd: int, stream: str) -> None:
        assert self._loop is not None
        if not self.pipes[rank].read_stream(fd, stream, self._loop.lines):
            self._end_stream(fd)

    def _on_events(self, rank: int) -> None:
        loop, pipes = self._loop, self.pipes[rank]
        assert loop is not None
        decoded, open_ = pipes.read_channel()
        if not open_:
            self._end_stream(pipes.channel)
        for event in decoded:
            loop.event(rank, event)

    def _on_pidfd(self, rank: int) -> None:
        loop, proc, pipes = self._loop, self.processes[rank], self.pipes[rank]
        assert loop is not None
        code = proc.poll()
        if code is None:
            return
        for fd in (*pipes.fds, proc.pidfd):
            if fd is not None:
                loop.remove_reader(fd)
        for event in pipes.drain(loop.lines):
            loop.event(rank, event)
        loop.exited(rank, code)

    def _end_stream(self, fd: int) -> None:
        self._ended_streams.add(fd)
        if self._loop is not None:
            self._loop.remove_reader(fd)

    # -- acting on the ranks ---------------------------------------------------------------------

    def signal(self, sig: int, ranks: Iterable[int]) -> None:
        for rank in ranks:
            self.processes[rank].send(sig)

    def returncode(self, rank: int) -> int | None:
        return self.processes[rank].poll()

    def was_signalled(self, rank: int) -> bool:
        return bool(self.processes[rank].signals_sent)

    def last_lines(self, rank: int) -> list[str]:
        return list(self.pipes[rank].last_lines)

    def pid(self, rank: int) -> int:
        return self.processes[rank].pid

    def local_pids(self) -> dict[int, int]:
        """Rank -> pid of every rank still running: all are on this node (the loop samples them)."""
        return {p.rank: p.pid for p in self.processes if p.returncode is None}

    def local_gpus(self) -> dict[int, int]:
        """Rank -> the CUDA index (as the kernel sees it) of each rank on a GPU: rank r uses
        ``cuda:r`` of its CUDA_VISIBLE_DEVICES, the plan's ``gpus``, so the kernel's ``gpus[r]``."""
        return dict(enumerate(self.gpus)) if self.gpus else {}

    def stacks(self, ranks: Iterable[int]) -> dict[int, RankStack]:
        running = {rank: self.processes[rank].pid for rank in ranks if self.processes[rank].returncode is None}
        return self.stack_files.collect(running) if running else {}

    def release(self) -> None:
        for pipes in self.pipes:
            if pipes.commands is None:
                continue
            try:
                os.write(pipes.commands, b"\0")
            except OSError:  # the rank had no process group and is already gone
                pass

    def send(self, rank: int, kind: events.Kind, payload: bytes, attached: shm.Attachments | None = None) -> None:
        pipes = self.pipes[rank]
        if pipes.commands is None:
            raise OSError(f"rank {rank} has no command stream")
        if attached is not None and attached.fds:
            if pipes.shared is None:
                raise OSError(f"rank {rank} has no fd socket for shared memory")
            pipes.shared.post(attached, close=False)  # every rank gets its own copies of the fds
        events.send_bytes(pipes.commands, kind, payload, defer_sigint=False)

    @property
    def shares_memory(self) -> bool:
        """Big values can travel to these ranks as memfds (they are on this machine)."""
        return True

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
        self.stack_files.close()
        for pipes in self.pipes:
            pipes.close()
        for proc in self.processes:
            proc.close()


def _environment(plan: LaunchPlan, rendezvous: Rendezvous, rank: int, attempt: int, world: NodeWorld | None = None) -> dict[str, str]:
    if world is not None:  # one node of a num_nodes launch: its ranks' place in the whole world
        return rank_environment(
            rank=world.first_rank + rank,
            world_size=world.world_size,
            local_rank=rank,
            local_world_size=plan.num_processes,
            node_rank=world.node_rank,
            num_nodes=world.num_nodes,
            master_addr=rendezvous.address,
            master_port=rendezvous.port,
            device_type=plan.device_type,
            mixed_precision=plan.mixed_precision,
            restart_count=attempt,
            max_restarts=plan.max_restarts,
            run_id=world.run_id,
            visible_gpus=plan.gpus,
            gpu_vendor=plan.gpu_vendor or "nvidia",
            socket_interface=world.socket_interface,
        )
    return rank_environment(
        rank=rank,
        world_size=plan.num_processes,
        master_addr=rendezvous.address,
        master_port=rendezvous.port,
        device_type=plan.device_type,
        mixed_precision=plan.mixed_precision,
        restart_count=attempt,
        max_restarts=plan.max_restarts,
        run_id=plan.run_id,
        visible_gpus=plan.gpus,
        gpu_vendor=plan.gpu_vendor or "nvidia",
    )
