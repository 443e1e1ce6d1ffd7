"""One launch's ranks on one node, as the agent runs them: started by torch elastic, relayed signed.

``start_processes`` (torch.distributed.elastic.multiprocessing, fork) creates the processes with
the environment torchrun would give them; nbaccel's pipes (inherited across the fork) carry each
rank's stdout, stderr and channel frames to the agent, which forwards them to the kernel. The
agent watches the processes' sentinels itself: elastic's own monitor blocks (and after a failure
waits up to 30 s in ``close``), while the kernel decides how a launch ends on every node at once.

Example::

    ranks = NodeRanks(spec, job_bytes, emit=send_to_kernel, interface="eth0", close_fds=[sock])
    ranks.start()
    ... # the agent's loop calls ranks.on_readable(fd) / ranks.on_clock(now)
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from nbaccel.launch import warm
from nbaccel.launch.escalation import LINGER, STOP_PLANS, Escalation
from nbaccel.launch.pipes import RankPipes, close_child_ends, open_rank_pipes
from nbaccel.launch.sampler import ResourceSampler
from nbaccel.launch.stacks import STACK_FILE_VARIABLE, StackFiles
from nbaccel.net import protocol
from nbaccel.rank.agent_entry import run_remote_rank
from nbaccel.wire import events, rich
from nbaccel.wire.rank_env import rank_environment

Emit = Callable[..., None]  # emit(kind, body=None, raw=None)


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


def _logs_specs() -> Any:
    """Elastic's log destinations, minus what nbaccel does itself.

    The ranks' output goes through nbaccel's pipes (and lands in the kernel's per-launch log
    folder), and errors through their channel. Elastic's default for ``log_dir=os.devnull``
    still tails /dev/null in two thread pools per launch, whose shutdown costs 0.1-0.2 s.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import LogsDest

    class ConsoleOnly(DefaultLogsSpecs):
        def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
            for env in envs.values():
                env["TORCHELASTIC_ERROR_FILE"] = ""
            console = dict.fromkeys(envs, "")
            return LogsDest(console, dict(console), {}, {}, dict.fromkeys(envs, os.devnull), os.devnull, os.devnull)

    return ConsoleOnly(log_dir=os.devnull)


class NodeRanks:
    """The local ranks of one launch: start, relay, signal on the kernel's word, reap."""

    def __init__(self, spec: dict[str, Any], job_bytes: bytes, emit: Emit, interface: str | None, close_fds: list[int]) -> None:
        self.spec = spec
        self.launch: str = spec["launch"]
        self.first_rank: int = spec["first_rank"]
        self._job_bytes = job_bytes
        self._emit = emit
        self._interface = interface
        self._close_fds = close_fds
        self.pipes: list[RankPipes] = []
        self.processes: list[Any] = []  # multiprocessing.Process, one per local rank
        self.signals_sent: dict[int, list[int]] = {}
        self.exited: set[int] = set()
        self._context: Any = None
        self._stack_files: StackFiles | None = None
        self._escalation = Escalation(self._send_each)  # the stop's timed signals, as on one node
        self._sampler: ResourceSampler | None = None  # this node's ranks, sampled here and sent as RICH events

    @property
    def nproc(self) -> int:
        return int(self.spec["nproc"])

    def start(self) -> None:
        """Create every local rank through torch elastic; on failure nothing is left running."""
        from torch.distributed.elastic.multiprocessing import start_processes

        ends = []
        try:
            for local in range(self.nproc):
                parent, child = open_rank_pipes(self.first_rank + local, with_commands=True)
                self.pipes.append(parent)
                ends.append(child)
            self._stack_files = StackFiles()  # where a rank dumps its stacks when asked (0700)
            envs = {local: rank_env(self.spec, local, self._interface) for local in range(self.nproc)}
            for local, env in envs.items():
                env[STACK_FILE_VARIABLE] = self._stack_files.path(self.first_rank + local)
            kernel_side = [fd for p in self.pipes for fd in p.all_fds] + self._close_fds
            args = {local: (self._job_bytes, envs[local], ends[local], kernel_side, os.getpid()) for local in range(self.nproc)}
            # Forking while the previous launch's objects await collection crashed ranks in the
            # collector (research/multinode.md). The agent collected fully after that launch
            # (off the critical path); collect what is young now, and freeze what ranks inherit.
            gc.collect(1)
            gc.freeze()
            try:
                self._context = start_processes(
                    name=f"nbaccel-{self.launch}",
                    entrypoint=run_remote_rank,
                    args=args,
                    envs=envs,
                    logs_specs=_logs_specs(),
                    start_method="fork",
                )
            finally:
                gc.unfreeze()
            self.processes = list(self._context._pc.processes)
            pids = {self.first_rank + local: p.pid for local, p in enumerate(self.processes)}
            self._sampler = ResourceSampler(pids, time.monotonic(), gpus=self._cuda_indices())
        finally:
            for child in ends:
                close_child_ends(child)
        self.signals_sent = {local: [] for local in range(self.nproc)}

    def _cuda_indices(self) -> dict[int, int]:
        """Global rank -> the CUDA index (as this agent sees it) of each rank on a GPU: local rank l
        uses ``cuda:l`` of its CUDA_VISIBLE_DEVICES (the spec's ``gpus``, else this agent's)."""
        if self.spec["device_type"] != "cuda":
            return {}
        chosen = self.spec.get("gpus")
        return {self.first_rank + local: int(chosen[local]) if chosen else local for local in range(self.nproc) if not chosen or local < len(chosen)}

    def readers(self) -> list[tuple[int, Callable[[], bool]]]:
        """(fd, handler) pairs for the agent's selector, pipes first, then process sentinels;
        a handler returns False when its fd is finished with (end of file, process reaped)."""
        found: list[tuple[int, Callable[[], bool]]] = []
        for local, pipes in enumerate(self.pipes):
            found.append((pipes.channel, functools.partial(self._on_channel, local)))
            found.append((pipes.stdout, functools.partial(self._on_stream, local, "stdout")))
            found.append((pipes.stderr, functools.partial(self._on_stream, local, "stderr")))
        for local, proc in enumerate(self.processes):
            found.append((proc.sentinel, functools.partial(self._on_exit, local)))
        return found

    @property
    def done(self) -> bool:
        return len(self.exited) == self.nproc

    def _lines_to_kernel(self, rank: int, stream: str, lines: list[str]) -> None:
        self._emit(protocol.LINES, {"rank": rank, "stream": stream, "lines": lines})

    def _on_stream(self, local: int, stream: str) -> bool:
        pipes = self.pipes[local]
        return pipes.read_stream(pipes.stdout if stream == "stdout" else pipes.stderr, stream, self._lines_to_kernel)

    def _on_channel(self, local: int) -> bool:
        frames, open_ = self.pipes[local].read_channel()
        self._forward(local, frames)
        return open_

    def _forward(self, local: int, decoded: list[events.Event]) -> None:
        for event in decoded:
            if event.kind is events.Kind.IMPORTED:  # warm the agent, not the kernel: ranks fork from here
                warm.note(event.value())  # from our own child, over a private pipe
            else:
                self._emit(protocol.FRAME, raw=protocol.pack_frame(self.first_rank + local, int(event.kind), event.payload))

    def _on_exit(self, local: int) -> bool:
        if local in self.exited:
            return False
        if self.processes[local].exitcode is None:
            return True
        self._forward(local, self.pipes[local].drain(self._lines_to_kernel))
        self.exited.add(local)
        code = self.processes[local].exitcode
        self._emit(
            protocol.EXITED, {"rank": self.first_rank + local, "returncode": code, "signals_sent": self.signals_sent[local], **self._memory_words(local, code)}
        )
        return False

    def _memory_words(self, local: int, code: int | None) -> dict[str, Any]:
        """The rank's peak and, for a SIGKILL this agent did not send, whether it was the OOM killer:
        decided here, with the one-node code, since only this node knows the rank's cgroup."""
        if self._sampler is None:
            return {}
        rank = self.first_rank + local
        killed = code == -signal.SIGKILL and not self.signals_sent[local]
        return {"peak_rss": self._sampler.peaks.get(rank), "out_of_memory": self._sampler.out_of_memory(rank) if killed else None}

    # -- the kernel's orders -------------------------------------------------------------------

    def release(self) -> None:
        """Every rank of every node returned: let them leave their process group."""
        for pipes in self.pipes:
            if pipes.commands is not None:
                try:
                    os.write(pipes.commands, b"\0")
                except OSError:
                    pass

    def command(self, rank: int, kind: int, payload: bytes) -> None:
        """Write one frame into ``rank``'s command pipe (a persistent worker's task or stop)."""
        local = rank - self.first_rank
        commands = self.pipes[local].commands if 0 <= local < self.nproc and local not in self.exited else None
        if commands is not None:
            try:
                events.send_bytes(commands, events.decode_kind(kind), payload, defer_sigint=False)
            except OSError:  # it died: its exit is reported on its own
                pass

    def stacks(self, ranks: list[int], timeout: float = 2.0) -> dict[int, str]:
        """Each running rank's raw stack dump (the kernel names cells and summarises it)."""
        running = {
            r: self.processes[r - self.first_rank].pid for r in ranks if 0 <= r - self.first_rank < self.nproc and r - self.first_rank not in self.exited
        }
        if self._stack_files is None or not running:
            return {}
        return self._stack_files.dumps(running, timeout)  # summarised in the kernel, which has the cells' source

    def signal_ranks(self, ranks: list[int], sig: int) -> None:
        """Send ``sig`` to the given global ranks of this node now (a pool's interrupt)."""
        for rank in ranks:
            if 0 <= rank - self.first_rank < self.nproc:
                self._send(rank - self.first_rank, sig)

    def stop(self, reason: str, spare: int | None = None) -> None:
        """Signal every live rank (but ``spare``, a global rank exiting by itself) per ``reason``."""
        now = time.monotonic()
        others = [local for local in range(self.nproc) if self.first_rank + local != spare]
        self._escalation.start(STOP_PLANS.get(reason, STOP_PLANS["stopped"]), others, now=now)
        if spare is not None and 0 <= spare - self.first_rank < self.nproc:
            self._escalation.start([(LINGER, signal.SIGKILL)], [spare - self.first_rank], keep=True, now=now)
        self.on_clock(now)

    def next_signal_at(self) -> float | None:
        """The next moment this wants the agent's clock: a timed signal, or the next sample."""
        due = self._escalation.next_at()
        moments = [due] if due is not None else []
        if self._sampler is not None and not self.done:
            moments.append(self._sampler.due())
        return min(moments) if moments else None

    def on_clock(self, now: float) -> None:
        self._escalation.fire(now)
        if self._sampler is not None and now >= self._sampler.due():
            running = [self.first_rank + local for local in range(len(self.processes)) if local not in self.exited]
            for rank, sample in self._sampler.sample(now, running).items():  # the kernel's sink shows them as a local rank's
                self._emit(protocol.FRAME, raw=protocol.pack_frame(rank, int(events.Kind.RICH), events.dumps(rich.resources_event(sample))))

    def _send_each(self, sig: int, locals_: list[int]) -> None:
        for local in locals_:
            self._send(local, sig)

    def _send(self, local: int, sig: int) -> None:
        proc = self.processes[local]
        if local in self.exited or proc.exitcode is not None:  # reaped: its pid may be reused
            return
        self.signals_sent[local].append(sig)
        try:
            os.killpg(proc.pid, sig)  # the rank leads its own pgid (its DataLoader workers too)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill_and_close(self) -> None:
        """SIGKILL whatever still runs, reap it, and free every pipe, queue and sentinel."""
        for local in range(len(self.processes)):
            self._send(local, signal.SIGKILL)
        for proc in self.processes:
            proc.join(5.0)
        if self._context is not None:
            self._context.close(timeout=1)
            for queue in self._context._ret_vals.values():
                queue.close()
        for proc in self.processes:
            try:
                proc.close()
            except ValueError:  # still running after SIGKILL (uninterruptible sleep): leave it
                pass
        for pipes in self.pipes:
            pipes.close()
        if self._stack_files is not None:
            self._stack_files.close()
            self._stack_files = None
        self.processes, self.pipes = [], []
