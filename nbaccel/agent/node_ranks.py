"""One launch's ranks on one node, as the agent runs them: started as one node's ranks are, relayed signed.

The ranks are a ``LocalRankGroup`` started by the ``ForkStarter`` (``nbaccel.launch``): the same
pipes, pids, pidfds, signals, release and GPU map as a launch on one machine, with the
environment torchrun would give them and the kernel's store as their rendezvous. Where one node's
group feeds the event loop, this one feeds ``NodeRanks`` (a ``RankFeed``): each rank's lines,
frames and exit go to the kernel over the signed link, under the rank's number in the launch. The
kernel decides how a launch ends on every node at once; the agent escalates a stop with the
one-node ``Escalation`` and samples its ranks with the one-node sampler.

Example::

    ranks = NodeRanks(spec, job_bytes, emit=send_to_kernel, interface="eth0", close_fds=[sock], selector=selector)
    ranks.start()  # its sources are in the agent's selector from here on
    ... # the agent's loop calls each ready key's handler, and ranks.on_clock(now)
    ranks.kill_and_close()
"""

from __future__ import annotations

import gc
import selectors
import signal
import time
from collections.abc import Callable
from typing import Any

from nbaccel.launch import warm
from nbaccel.launch.escalation import LINGER, STOP_PLANS, Escalation
from nbaccel.launch.group import LocalRankGroup
from nbaccel.launch.loop import sampler_for
from nbaccel.launch.sampler import ResourceSampler
from nbaccel.launch.starters.fork import ForkStarter
from nbaccel.net import protocol
from nbaccel.rank.agent_entry import remote_job
from nbaccel.wire import events, rich
from nbaccel.wire.rank_env import rank_environment

Emit = Callable[..., None]  # emit(kind, body=None, raw=None)
# Whose tools sample a node's GPU ranks, by the launch's device type: NVML for "cuda" (the spec
# names no vendor), none for Intel's "xpu" (no per-process memory without Level Zero).
_SAMPLED_BY = {"cuda": "nvidia", "xpu": "intel"}


def rank_env(spec: dict[str, Any], local_rank: int, interface: str | None) -> dict[str, str]:
    """The environment of one rank, as torchrun would set it, plus nbaccel's own variables."""
    return rank_environment(
        rank=spec["first_rank"] + local_rank,
        world_size=spec["world_size"],
        master_port=spec["master_port"],
        master_addr=spec["master_addr"],
        device_type=spec["device_type"],
        local_rank=local_rank,
        local_world_size=spec["nproc"],
        node_rank=spec["node_rank"],
        num_nodes=spec["nnodes"],
        run_id=spec["run_id"],
        mixed_precision=spec["mixed_precision"],
        restart_count=spec["attempt"],
        max_restarts=spec["max_restarts"],
        visible_gpus=spec.get("gpus"),
        # Unknown (an IPv6 link, say): loopback would be wrong across nodes, so "" lets gloo choose.
        socket_interface=interface or "",
    )


class NodeRanks:
    """The local ranks of one launch: start, relay, signal on the kernel's word, reap.

    The group numbers its ranks 0..nproc-1 (``local``); the kernel knows them as
    ``first_rank + local``, the number every message to it carries.
    """

    def __init__(
        self, spec: dict[str, Any], job_bytes: bytes, emit: Emit, interface: str | None, close_fds: list[int], selector: selectors.BaseSelector
    ) -> None:
        self.spec = spec
        self.launch: str = spec["launch"]
        self.first_rank: int = spec["first_rank"]
        self._job_bytes = job_bytes
        self._emit = emit
        self._interface = interface
        self._close_fds = close_fds
        self._selector = selector
        self._watched: set[int] = set()  # fds this launch registered in the agent's selector
        self.group: LocalRankGroup | None = None
        self.ended: set[int] = set()  # local ranks whose exit was relayed
        self._escalation = Escalation(self._signal_locals)  # the stop's timed signals, as on one node
        self._sampler: ResourceSampler | None = None  # this node's ranks, sampled here and sent as RICH events

    @property
    def nproc(self) -> int:
        return int(self.spec["nproc"])

    def start(self, starter: ForkStarter | None = None) -> None:
        """Fork every local rank (as one node's are) and watch them; on failure nothing is left running."""
        environments = [rank_env(self.spec, local, self._interface) for local in range(self.nproc)]
        # Forking while the previous launch's objects await collection crashed ranks in the
        # collector (research/multinode.md). The agent collected fully after that launch (off the
        # critical path); collect what is young now (the group freezes what the ranks inherit).
        gc.collect(1)
        gpus = self.spec.get("gpus")
        self.group = LocalRankGroup.start_node(
            starter or ForkStarter(),
            remote_job(self._job_bytes),
            environments,
            self.spec["device_type"],
            [int(g) for g in gpus] if gpus else None,
            close_fds=self._close_fds,
            gpu_vendor=_SAMPLED_BY.get(self.spec["device_type"], ""),
        )
        self._sampler = sampler_for(self.group)
        self.group.attach(self)

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self.group.processes] if self.group is not None else []

    @property
    def done(self) -> bool:
        return len(self.ended) == self.nproc

    # -- what the group's sources call (a RankFeed) ----------------------------------------------

    def add_reader(self, fd: int, handler: Callable[[], None], order: tuple[int, int]) -> None:
        self._selector.register(fd, selectors.EVENT_READ, handler)
        self._watched.add(fd)

    def remove_reader(self, fd: int) -> None:
        if fd in self._watched:
            self._watched.discard(fd)
            self._selector.unregister(fd)

    def lines(self, local: int, stream: str, lines: list[str]) -> None:
        self._emit(protocol.LINES, {"rank": self.first_rank + local, "stream": stream, "lines": lines})

    def event(self, local: int, event: events.Event) -> None:
        if event.kind is events.Kind.IMPORTED:  # warm the agent, not the kernel: ranks fork from here
            warm.note(event.value())  # from our own child, over a private pipe
        else:
            self._emit(protocol.FRAME, raw=protocol.pack_frame(self.first_rank + local, int(event.kind), event.payload))

    def exited(self, local: int, returncode: int) -> None:
        """The group reaped ``local`` and drained its pipes: tell the kernel, with what this node knows."""
        assert self.group is not None
        self.ended.add(local)
        sent = self.group.processes[local].signals_sent
        body = {"rank": self.first_rank + local, "returncode": returncode, "signals_sent": list(sent), **self._memory_words(local, returncode)}
        self._emit(protocol.EXITED, body)

    def _memory_words(self, local: int, code: int) -> dict[str, Any]:
        """The rank's peak and, for a SIGKILL this agent did not send, whether it was the OOM killer:
        decided here, with the one-node code, since only this node knows the rank's cgroup."""
        if self._sampler is None or self.group is None:
            return {}
        killed = code == -signal.SIGKILL and not self.group.was_signalled(local)
        return {"peak_rss": self._sampler.peaks.get(local), "out_of_memory": self._sampler.out_of_memory(local) if killed else None}

    # -- the kernel's orders -------------------------------------------------------------------

    def _local(self, rank: int) -> int | None:
        """The group's number of the launch's ``rank``, if it runs here."""
        local = rank - self.first_rank
        return local if 0 <= local < self.nproc else None

    def release(self) -> None:
        """Every rank of every node returned: let them leave their process group."""
        if self.group is not None:
            self.group.release()

    def command(self, rank: int, kind: int, payload: bytes) -> None:
        """Write one frame into ``rank``'s command pipe (a persistent worker's task or stop)."""
        local = self._local(rank)
        if self.group is None or local is None or local in self.ended:
            return
        try:
            self.group.send(local, events.decode_kind(kind), payload)
        except OSError:  # it died: its exit is reported on its own
            pass

    def stacks(self, ranks: list[int], timeout: float = 2.0) -> dict[int, str]:
        """Each running rank's raw stack dump (the kernel names cells and summarises it)."""
        if self.group is None:
            return {}
        chosen = [local for local in map(self._local, ranks) if local is not None and local not in self.ended]
        running = {local: self.group.pid(local) for local in chosen if self.group.returncode(local) is None}
        if not running:
            return {}
        dumps = self.group.stack_files.dumps(running, timeout)  # summarised in the kernel, which has the cells' source
        return {self.first_rank + local: text for local, text in dumps.items()}

    def signal_ranks(self, ranks: list[int], sig: int) -> None:
        """Send ``sig`` to the given global ranks of this node now (a pool's interrupt)."""
        self._signal_locals(sig, [local for local in map(self._local, ranks) if local is not None])

    def stop(self, reason: str, spare: int | None = None) -> None:
        """Signal every live rank (but ``spare``, a global rank exiting by itself) per ``reason``."""
        now = time.monotonic()
        others = [local for local in range(self.nproc) if self.first_rank + local != spare]
        self._escalation.start(STOP_PLANS.get(reason, STOP_PLANS["stopped"]), others, now=now)
        spared = None if spare is None else self._local(spare)
        if spared is not None:
            self._escalation.start([(LINGER, signal.SIGKILL)], [spared], keep=True, now=now)
        self.on_clock(now)

    def next_signal_at(self) -> float | None:
        """The next moment this wants the agent's clock: a timed signal, the next sample, or (where
        the OS has no pidfd) the next look for exits."""
        now = time.monotonic()
        due = self._escalation.next_at()
        moments = [due] if due is not None else []
        if self._sampler is not None and not self.done:
            moments.append(self._sampler.due())
        poll = self.group.poll() if self.group is not None else None
        if poll is not None:
            moments.append(now + poll)
        return min(moments) if moments else None

    def on_clock(self, now: float) -> None:
        self._escalation.fire(now)
        if self._sampler is not None and now >= self._sampler.due():
            running = [local for local in range(self.nproc) if local not in self.ended]
            for local, sample in self._sampler.sample(now, running).items():  # the kernel's sink shows them as a local rank's
                payload = events.dumps(rich.resources_event(sample))
                self._emit(protocol.FRAME, raw=protocol.pack_frame(self.first_rank + local, int(events.Kind.RICH), payload))

    def _signal_locals(self, sig: int, locals_: list[int]) -> None:
        if self.group is not None:
            self.group.signal(sig, [local for local in locals_ if local not in self.ended])  # a reaped rank is never signalled

    def wait_ended(self, grace: float) -> None:
        """Wait up to ``grace`` seconds for every rank to end, woken by each exit (pidfds), not a clock."""
        deadline = time.monotonic() + grace
        for proc in self.group.processes if self.group is not None else []:
            proc.wait(max(0.0, deadline - time.monotonic()))

    def kill_and_close(self) -> None:
        """SIGKILL whatever still runs, reap it, and free every pipe, pidfd and stack file."""
        for fd in list(self._watched):
            self.remove_reader(fd)
        if self.group is not None:
            self.group.detach(self)
            self.group.close()
            self.group = None
