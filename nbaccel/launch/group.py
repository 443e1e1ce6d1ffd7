"""The ranks of one node: pipes, pids and pidfds, and on one machine a private loopback rendezvous.

A ``LocalRankGroup`` serves one attempt of a one-shot launch and the lifetime of a persistent
worker pool alike. It is the ``RankGroup`` the one-node ``LocalGroupStarter`` hands to the event loop:
its sources are each rank's stdout, stderr and event pipes and its pidfd. A node agent starts its
share of a launch across nodes as the same group (``start_node``: the rendezvous is the kernel's),
and relays what the group's sources say to the kernel instead of a loop (``nbaccel.agent.node_ranks``).

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
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from nbaccel.launch.pipes import RankPipes, close_child_ends, open_rank_pipes
from nbaccel.launch.processes import RankProcess
from nbaccel.launch.rendezvous import LoopbackRendezvous
from nbaccel.launch.seam import LaunchPlan, RankFeed, RankStarter
from nbaccel.launch.stacks import STACK_FILE_VARIABLE, RankStack, StackFiles
from nbaccel.wire import events, shm
from nbaccel.wire.job import Job
from nbaccel.wire.rank_env import rank_environment

if TYPE_CHECKING:
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

    def __init__(
        self,
        rendezvous: Rendezvous | None,
        stack_files: StackFiles,
        device_type: str = "cpu",
        gpus: Sequence[int] | None = None,
        close_fds: Sequence[int] = (),
        with_shared: bool = True,
        gpu_vendor: str = "",
        world: NodeWorld | None = None,
    ) -> None:
        self.rendezvous = rendezvous  # None: the ranks' store is elsewhere (a node agent's: the kernel's)
        self.world = world  # this node's place in a num_nodes launch; None: the ranks are the whole world
        self.stack_files = stack_files
        self.processes: list[RankProcess] = []
        self.pipes: list[RankPipes] = []
        self._loop: RankFeed | None = None
        self._ended_streams: set[int] = set()  # fds at end of file: never watched again
        self.device_type = device_type
        self.gpus: tuple[int, ...] = tuple(int(g) for g in gpus or ())  # the ranks' GPUs (as this process numbers them), one a rank
        self.gpu_vendor = gpu_vendor  # whose tools sample them (nbaccel.launch.loop.sampler_for)
        self._close_fds = list(close_fds)  # the starter's own fds no rank may keep (an agent's link)
        self._with_shared = with_shared
        self._launch_ranks = False  # True for a node agent's group: its ranks' RANK is the launch's

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
        gpus = plan.gpus if plan.device_type != "cpu" else None
        group = cls(rendezvous, StackFiles(), plan.device_type, gpus, gpu_vendor=plan.gpu_vendor, world=world)
        environments = [_environment(plan, rendezvous, rank, attempt, world) for rank in range(plan.num_processes)]
        return group._start_all(starter, job, environments, store_now=persistent)

    @classmethod
    def start_node(
        cls,
        starter: RankStarter,
        job: Job,
        environments: Sequence[dict[str, str]],
        device_type: str,
        gpus: Sequence[int] | None,
        close_fds: Sequence[int],
        gpu_vendor: str = "",
    ) -> LocalRankGroup:
        """Start a node agent's share of a launch across nodes: rank ``i`` of the group gets
        ``environments[i]`` (its ``RANK`` the launch's; its store the kernel's, so no rendezvous
        here). ``gpus``: the ranks' CUDA_VISIBLE_DEVICES, None for the node's own order. Big values
        come in-band (no fd socket): they crossed the network already."""
        group = cls(None, StackFiles(), device_type, gpus, close_fds=close_fds, with_shared=False, gpu_vendor=gpu_vendor)
        group._launch_ranks = True
        return group._start_all(starter, job, environments, store_now=False)

    def _start_all(self, starter: RankStarter, job: Job, environments: Sequence[dict[str, str]], store_now: bool) -> LocalRankGroup:
        # Frozen objects are never scanned by a rank's garbage collector, so the kernel's heap
        # stays shared instead of being copied page by page into every rank (copy-on-write).
        gc.freeze()
        try:
            try:
                for index, env in enumerate(environments):
                    self._start_rank(starter, job, index, {**env, STACK_FILE_VARIABLE: self.stack_files.path(index)})
                if store_now and self.rendezvous is not None:  # after the forks: the ranks are starting while the store comes up
                    self.rendezvous.start_store(len(environments))
            finally:
                gc.unfreeze()  # only the ranks keep them frozen; the kernel collects as before
                starter.release()
        except BaseException:  # an interrupt too, wherever it lands (unfreezing takes a while): no rank is left
            self.close()
            raise
        return self

    def _start_rank(self, starter: RankStarter, job: Job, index: int, env: dict[str, str]) -> None:
        """Start the group's rank ``index`` (a node agent's: known to its debugger as the launch's ``RANK``)."""
        parent_ends, child_ends = open_rank_pipes(index, with_commands=True, with_shared=self._with_shared)
        self.pipes.append(parent_ends)
        # The rank must not hold the kernel's ends of any rank's pipes (EOF would never come),
        # nor the rendezvous socket (the port would outlive the launch), nor its starter's own.
        inherited = [fd for p in self.pipes for fd in p.all_fds] + self._close_fds
        inherited += [p.shared.sock.fileno() for p in self.pipes if p.shared is not None]
        if self.rendezvous is not None:
            if self.rendezvous.listen_fd is not None:
                inherited.append(self.rendezvous.listen_fd)
            inherited += self.rendezvous.child_closes
        number = int(env["RANK"]) if self._launch_ranks else index  # a node agent's rank is known by its launch's number
        try:
            pid = starter.start(job, number, env, child_ends, inherited)
        finally:
            close_child_ends(child_ends)
        self.processes.append(starter.process(index, pid))

    # -- feeding the loop ------------------------------------------------------------------------

    def attach(self, loop: RankFeed) -> None:
        self._loop = loop
        if self.rendezvous is not None and self.rendezvous.listen_fd is not None and not self.rendezvous.store_started:
            loop.add_reader(self.rendezvous.listen_fd, self._start_store, _STORE_ORDER)
        for proc, pipes in zip(self.processes, self.pipes, strict=True):
            if proc.returncode is not None:
                continue
            sources = ((pipes.channel, self._on_events), (pipes.stdout, self._on_stdout), (pipes.stderr, self._on_stderr), (proc.pidfd, self._on_pidfd))
            for order, (fd, handler) in enumerate(sources):
                if fd is not None and fd not in self._ended_streams:
                    loop.add_reader(fd, functools.partial(handler, proc.rank), (proc.rank, order))

    def detach(self, loop: RankFeed) -> None:
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
        assert self._loop is not None and self.rendezvous is not None
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
        """Rank -> the CUDA index (as this process sees it) of each rank on a GPU (``gpu_map``)."""
        return gpu_map(self.device_type, self.gpus, self.num_processes)

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
        """Big values can travel to these ranks as memfds (they are on this machine, with an fd socket)."""
        return self._with_shared

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
        self.close_handles()

    def close_handles(self) -> None:
        """Free the port, the stack files, the pipes and the pidfds (the ranks are reaped, or not ours)."""
        if self.rendezvous is not None:
            self.rendezvous.close()
        self.stack_files.close()
        for pipes in self.pipes:
            pipes.close()
        for proc in self.processes:
            proc.close()


def gpu_map(device_type: str, gpus: Sequence[int] | None, num_processes: int) -> dict[int, int]:
    """Rank -> the CUDA index (as the starting process sees it) of each of a group's ranks on a GPU.

    Rank r uses ``cuda:r`` of its CUDA_VISIBLE_DEVICES, which is ``gpus`` (the kernel's plan on one
    node, a node agent's spec when it names them), so index ``gpus[r]`` here; without ``gpus``,
    the node's own order: ``r``. CPU ranks have none. The one map, on one node and on an agent.

    Example:
        >>> gpu_map("cuda", [2, 3], 2), gpu_map("cuda", None, 2), gpu_map("cpu", None, 2)
        ({0: 2, 1: 3}, {0: 0, 1: 1}, {})
    """
    if device_type == "cpu":
        return {}
    if not gpus:
        return {rank: rank for rank in range(num_processes)}
    return {rank: int(gpus[rank]) for rank in range(min(num_processes, len(gpus)))}


def _environment(plan: LaunchPlan, rendezvous: Rendezvous, rank: int, attempt: int, world: NodeWorld | None = None) -> dict[str, str]:
    """Rank ``rank``'s environment: in the whole launch, or, with a ``world`` (one node of a
    ``num_nodes`` launch), at its place in the whole world."""
    return rank_environment(
        rank=rank + (world.first_rank if world is not None else 0),
        world_size=world.world_size if world is not None else plan.num_processes,
        local_rank=rank,
        local_world_size=plan.num_processes,
        node_rank=world.node_rank if world is not None else 0,
        num_nodes=world.num_nodes if world is not None else 1,
        run_id=world.run_id if world is not None else plan.run_id,
        socket_interface=world.socket_interface if world is not None else None,
        master_addr=rendezvous.address,
        master_port=rendezvous.port,
        device_type=plan.device_type,
        mixed_precision=plan.mixed_precision,
        restart_count=attempt,
        max_restarts=plan.max_restarts,
        visible_gpus=plan.gpus,
        gpu_vendor=plan.gpu_vendor or "nvidia",
    )
