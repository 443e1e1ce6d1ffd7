"""Persistent workers: ranks forked once, with a process group and namespaces that live across cells.

Example:
    >>> with start_workers(2, cpu=True) as pool:  # doctest: +SKIP
    ...     pool.push(scale=10)
    ...     pool.run(lambda: int(os.environ["RANK"]))
    [0, 1]
"""

from __future__ import annotations

import atexit
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nbaccel.wire import frames as channel
from nbaccel.errors import LaunchTimeoutError, NbaccelError, RankFailedError
from nbaccel.launch.seam import LaunchPlan, RankStarter
from nbaccel.launch.group import RankGroup
from nbaccel.launch.outcome import RankOutcome, Status, root_cause
from nbaccel.wire import events
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import Sink
from nbaccel.wire.portable import Sourced
from nbaccel.launch.plan import check_arguments, choose_starter, make_plan
from nbaccel.rank.bootstrap import Job
from nbaccel.pool.ready_watch import wait_until_ready
from nbaccel.pool.serve import serve
from nbaccel.pool.task_watch import TaskWatch
from nbaccel.pool.tasks import Assign, CallFunction, Fetch, RankStatus

_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()


class PoolStoppedError(NbaccelError):
    """The workers are gone (stopped, or torn down after a crash); start new ones."""


@dataclass(frozen=True)
class WorkerStatus:
    """One rank of a pool, as ``pool.status()`` reports it."""

    rank: int
    pid: int
    device: str
    state: str  # "idle", or how the process ended
    memory_mb: float  # resident memory of the process
    device_memory_mb: float | None  # CUDA memory allocated by torch on its GPU, when it has one
    last_cell: str  # the first line of the last task it ran

    def describe(self) -> str:
        gpu = f", {self.device_memory_mb:.0f} MiB on {self.device}" if self.device_memory_mb is not None else ""
        return f"rank {self.rank}: pid {self.pid}, {self.device}, {self.state}, {self.memory_mb:.0f} MiB{gpu}, last: {self.last_cell or '-'}"


class WorkerPool:
    """Ranks that keep their process group, namespaces and GPU memory between calls."""

    def __init__(self, plan: LaunchPlan, starter: RankStarter, seed: dict[str, Any] | None, start_timeout: float) -> None:
        self.plan = plan
        self.starter = starter
        self._seed = seed
        self._start_timeout = start_timeout
        self._group: RankGroup | None = None
        self.devices: list[str] = []
        self._last_task = ""

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> WorkerPool:
        """Fork the ranks and return once every rank has joined the process group (handshake)."""
        seed = self._seed if self.starter.start_method == "fork" else None  # spawn: fresh namespaces
        _import_rank_modules()
        job = Job(serve, args=(seed,), pass_ends=True)
        group = RankGroup.start(self.starter, job, self.plan, attempt=0, with_commands=True)
        try:
            deadline = time.monotonic() + self._start_timeout
            self.devices = wait_until_ready(group.processes, group.pipes, make_sink("text"), deadline)
        except BaseException:
            group.close()
            raise
        self._group = group
        _LIVE_POOLS.add(self)
        return self

    @property
    def alive(self) -> bool:
        return self._group is not None

    @property
    def num_processes(self) -> int:
        return self.plan.num_processes

    def stop(self, graceful: bool = True) -> None:
        """Tell every rank to leave (they tear down their process group), give them up to 2 s
        together, then SIGKILL whatever is left; every rank is reaped. Nothing outlives this."""
        group, self._group = self._group, None
        if group is None:
            return
        _LIVE_POOLS.discard(self)
        if graceful:
            for pipes in group.pipes:
                try:
                    channel.send_bytes(pipes.commands, channel.Kind.STOP, b"", defer_sigint=False)  # type: ignore[arg-type]
                except OSError:
                    pass
            deadline = time.monotonic() + 2.0
            for proc in group.processes:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        group.close()

    def restart(self) -> WorkerPool:
        """Fresh worker processes with empty namespaces and the same options."""
        self.stop()
        self._seed = None
        return self.start()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<WorkerPool {self.plan.num_processes} ranks on {self.plan.device_type}, {state}>"

    # -- work ------------------------------------------------------------------------------------

    def run(self, function: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None, timeout: float | None = None, output: str | Sink | None = None) -> Any:
        """Run ``function(*args)`` on the workers; every rank's value (a list, or a dict for ``ranks``)."""
        return self.run_task(CallFunction(Sourced.wrap(function), args), ranks=ranks, timeout=timeout, output=output, label=getattr(function, "__name__", "function"))

    def push(self, **values: Any) -> None:
        """Bind ``values`` in every rank's namespace (cloudpickle carries them)."""
        for name, value in values.items():  # one at a time, so a failure names the culprit
            try:
                _pickle_by_value(value)
            except Exception as exc:  # noqa: BLE001 - any pickling failure
                raise TypeError(f"cannot push {name!r}: a {type(value).__qualname__} cannot be pickled ({exc}); push plain data, tensors or modules instead.") from None
        self.run_task(Assign(values), output="text", label="push " + " ".join(values), remember=False)

    def pull(self, name: str, rank: int = 0) -> Any:
        """A variable of ``rank``'s namespace, with tensors moved to CPU (a module: its state_dict)."""
        return self.run_task(Fetch(name), ranks=[rank], output="text", label=f"pull {name}", remember=False)[rank]

    def status(self) -> list[WorkerStatus]:
        """Per rank: pid, device, idle or ended, memory in use, and the last cell it ran."""
        group = self._require_group()
        answers: dict[int, Any] = {}
        if all(p.poll() is None for p in group.processes):
            answers = self.run_task(RankStatus(), ranks=range(self.num_processes), output="text", label="", remember=False)
        return [self._status_of(rank, answers.get(rank)) for rank in range(self.num_processes)]

    def run_task(self, task: Callable[[dict[str, Any]], Any], ranks: Sequence[int] | None = None, timeout: float | None = None, output: str | Sink | None = None, label: str = "", remember: bool = True) -> Any:
        """Send ``task`` (a callable over the rank's namespace) to ``ranks`` and collect the answers."""
        group = self._require_group()
        chosen = self._check_ranks(ranks)
        check_arguments(task, (), None, "no", "auto", timeout, 0, "127.0.0.1")
        payload = _pickle_by_value(task)
        self._check_alive(group)
        sink = make_sink(output)
        sink.launch_started(self.num_processes, 0, ranks=chosen)
        for rank in chosen:  # the workers are up already: their chips say running at once
            sink.event(rank, events.started_event(group.processes[rank].pid))
        if remember:
            self._last_task = label
        watch = TaskWatch(group.processes, group.pipes, sink, chosen, None if timeout is None else time.monotonic() + timeout)
        try:
            self._send(group, chosen, payload)
            self._watch(watch)
        finally:
            watch.close()
        outcomes = [watch.outcomes[r] for r in chosen]
        sink.launch_finished(outcomes)
        self._raise_for(watch, outcomes, timeout)
        values = {o.rank: o.value for o in outcomes}
        return [values[r] for r in chosen] if ranks is None else values

    # -- internals -------------------------------------------------------------------------------

    def _require_group(self) -> RankGroup:
        if self._group is None:
            raise PoolStoppedError("the workers are not running; start them with nbaccel.start_workers(...) or %distributed start.")
        return self._group

    def _check_ranks(self, ranks: Sequence[int] | None) -> list[int]:
        if ranks is None:
            return list(range(self.num_processes))
        chosen = sorted(set(int(r) for r in ranks))
        outside = [r for r in chosen if not 0 <= r < self.num_processes]
        if not chosen or outside:
            raise ValueError(f"ranks {list(ranks)!r} are not all in this pool of {self.num_processes} ranks (0..{self.num_processes - 1}).")
        return chosen

    def _check_alive(self, group: RankGroup) -> None:
        dead = [p for p in group.processes if p.poll() is not None]
        if dead:
            self.stop()
            lines = ", ".join(f"rank {p.rank} (exit status {p.returncode})" for p in dead)
            raise PoolStoppedError(f"worker(s) ended while idle: {lines}; the pool was stopped. Start new workers.")

    def _send(self, group: RankGroup, ranks: list[int], payload: bytes) -> None:
        try:
            for rank in ranks:
                channel.send_bytes(group.pipes[rank].commands, channel.Kind.TASK, payload, defer_sigint=False)  # type: ignore[arg-type]
        except BaseException:  # a half-sent task leaves the command stream unusable
            self.stop()
            raise

    def _watch(self, watch: TaskWatch) -> None:
        try:
            watch.loop()
        except KeyboardInterrupt:
            watch.interrupt(Status.INTERRUPTED)
            try:
                watch.loop()
            except KeyboardInterrupt:  # a second interrupt: give up on the workers
                watch.exited.append(RankOutcome(-1, Status.INTERRUPTED))

    def _raise_for(self, watch: TaskWatch, outcomes: list[RankOutcome], timeout: float | None) -> None:
        if watch.exited or watch.stuck:
            self._tear_down(watch)
        if watch.reason is Status.INTERRUPTED:
            raise KeyboardInterrupt
        if watch.reason is Status.TIMED_OUT and not any(o.status is Status.FAILED for o in outcomes):
            raise LaunchTimeoutError(timeout or 0.0, watch.running_at_timeout, outcomes)
        root = root_cause(outcomes)
        if root is not None:
            raise RankFailedError(root, outcomes)

    def _tear_down(self, watch: TaskWatch) -> None:
        """A rank died or is stuck: the process group cannot be trusted; stop every rank."""
        crashed = [o for o in watch.exited if o.rank >= 0]
        stuck = watch.stuck
        for outcome in watch.outcomes.values():
            if outcome.status is Status.RUNNING:
                outcome.status = Status.STOPPED
        self.stop(graceful=False)
        if crashed:
            states = [*crashed, *(o for o in watch.outcomes.values() if o.rank not in {c.rank for c in crashed})]
            error = RankFailedError(crashed[0], sorted(states, key=lambda o: o.rank))
            print(f"nbaccel: {crashed[0].describe()}; the workers were stopped. Start new ones.", file=sys.stderr)
            raise error
        reason = f"rank(s) {', '.join(map(str, stuck))} did not stop within {watch.grace:g} s of the interrupt (stuck in a collective or native code)" if stuck else "interrupted twice"
        print(f"nbaccel: {reason}; the workers were stopped. Start new ones (%distributed start).", file=sys.stderr)
        raise KeyboardInterrupt(f"{reason}; the workers were stopped")

    def _status_of(self, rank: int, answer: Any) -> WorkerStatus:
        group = self._require_group()
        proc = group.processes[rank]
        code = proc.poll()
        state = "idle" if code is None else (f"killed by signal {-code}" if code < 0 else f"exited with code {code}")
        return WorkerStatus(
            rank=rank,
            pid=proc.pid,
            device=self.devices[rank] if rank < len(self.devices) else "?",
            state=state,
            memory_mb=_resident_mb(proc.pid),
            device_memory_mb=(answer or {}).get("device_memory_mb"),
            last_cell=self._last_task,
        )


def _import_rank_modules() -> None:
    """Import in the kernel, once, what every forked rank needs: each rank would import it again."""
    from nbaccel import state  # noqa: F401
    from nbaccel.notebook import cell  # noqa: F401


def _pickle_by_value(value: Any) -> bytes:
    """cloudpickle: what the notebook defined after the workers forked exists only in the kernel,
    so it must travel by value (plain pickle would name ``__main__.f``, unknown on the rank)."""
    import cloudpickle

    return cloudpickle.dumps(value)


def _resident_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            import os

            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def start_workers(
    num_processes: int | None = None,
    *,
    gpus: Sequence[int] | None = None,
    mixed_precision: str = "no",
    cpu: bool = False,
    start_method: str = "auto",
    namespace: dict[str, Any] | None = None,
    start_timeout: float = 120.0,
) -> WorkerPool:
    """Fork persistent workers and return when every rank has joined the process group.

    Args:
        num_processes: ranks to start; default one per visible GPU, or 2 CPU ranks on gloo.
        gpus, mixed_precision, cpu, start_method: as for ``notebook_launcher``.
        namespace: what every rank's namespace starts as (a copy, made by the fork); the magic
            passes the notebook's. Ignored under spawn: spawned ranks start empty.
        start_timeout: seconds to wait for every rank to be ready.

    Example:
        >>> pool = start_workers(2)  # doctest: +SKIP
        >>> pool.run(lambda: 1)  # doctest: +SKIP
        [1, 1]
        >>> pool.stop()  # doctest: +SKIP
    """
    check_arguments(start_workers, (), num_processes, mixed_precision, start_method, start_timeout, 0, "127.0.0.1")
    plan = make_plan(num_processes, mixed_precision, None, "127.0.0.1", None, 0, gpus, cpu, time.monotonic())
    return WorkerPool(plan, choose_starter(start_method), namespace, start_timeout).start()


@atexit.register
def _stop_every_pool() -> None:
    """At kernel shutdown: stop (and reap) every pool, so nothing holds the shutdown up."""
    for pool in list(_LIVE_POOLS):
        pool.stop(graceful=False)
