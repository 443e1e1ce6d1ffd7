"""Persistent workers: ranks forked once, with a process group and namespaces that live across cells.

Example:
    >>> with start_local_workers(LaunchOptions(num_processes=2, cpu=True)) as pool:
    ...     pool.push(scale=10)
    ...     pool.run(lambda: int(os.environ["RANK"]))
    [0, 1]
"""

from __future__ import annotations

import atexit
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbaccel.errors import LaunchTimeoutError, NbaccelError, RankFailedError
from nbaccel.launch.local import LocalGroupStarter
from nbaccel.launch.loop import EventLoop, SinkSession, sampler_for
from nbaccel.launch.notices import say
from nbaccel.launch.options import LaunchOptions, check_timeout
from nbaccel.launch.outcome import RankOutcome, Status, exit_words, root_cause, where_ranks_were
from nbaccel.launch.plan import choose_starter, make_plan
from nbaccel.launch.sampler import ResourceSampler
from nbaccel.launch.seam import GroupStarter, LaunchPlan, RankGroup, Sink
from nbaccel.launch.stacks import RankStack
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import CollectingSink
from nbaccel.output.text import RichTextSink
from nbaccel.pool import sharded
from nbaccel.pool.cuda_fatal import dead_cuda_notice, ranks_with_dead_cuda
from nbaccel.pool.in_step import CollectiveCount, out_of_step
from nbaccel.pool.leaving import wait_until_ended
from nbaccel.pool.ready import wait_until_ready
from nbaccel.pool.serve import serve
from nbaccel.pool.task_policy import Task, raise_stuck_error
from nbaccel.pool.worker_calls import Assign, CallFunction, FreeMemory, RankStatus
from nbaccel.rank import exit_hooks
from nbaccel.rank.debugger import DebugLastFailure
from nbaccel.wire import rich, shm
from nbaccel.wire.events import Kind
from nbaccel.wire.job import Job
from nbaccel.wire.portable import Sourced
from nbaccel.wire.shm import Attachments

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11; annotations only, never imported

_LIVE_POOLS: weakref.WeakSet[WorkerPool] = weakref.WeakSet()
_LEAVE_GRACE = 2.0  # seconds the workers have, together, to leave their process group on a stop
_COUNT_TIMEOUT = 10.0  # seconds for idle workers to say how many collectives they issued


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
    device_memory_mb: float | None  # CUDA memory allocated by torch's tensors on its GPU, when it has one
    last_cell: str  # the first line of the last task it ran
    cpu_percent: float | None = None  # of one core, since the previous sample (nbaccel.launch.sampler); None on another node
    peak_memory_mb: float | None = None  # most resident memory sampled since the workers started
    device_reserved_mb: float | None = None  # held by torch's caching allocator (what %distributed free can return)
    device_used_mb: float | None = None  # the whole device's use (cudaMemGetInfo: every process and context on it)
    gpu_held_mb: float | None = None  # what NVML lists for the rank's pid on its GPU, sampled by the kernel (nbaccel.devices.gpu_use)
    gpu_peak_mb: float | None = None  # the most of that sampled since the workers started
    gpu_util: float | None = None  # its GPU's utilisation, percent (NVML)
    shards: dict[str, tuple[int, int]] = field(default_factory=dict)  # sharded module -> (bytes of parameters this rank holds, full size)

    def describe(self) -> str:
        gpu = f", {self.device_memory_mb:.0f} MiB on {self.device}" if self.device_memory_mb is not None else ""
        return f"rank {self.rank}: pid {self.pid}, {self.device}, {self.state}, {self.memory_mb:.0f} MiB{gpu}, last: {self.last_cell or '-'}"


class WorkerPool:
    """Ranks that keep their process group, namespaces and GPU memory between calls."""

    def __init__(self, plan: LaunchPlan, group_starter: GroupStarter, seed: dict[str, Any] | None, start_timeout: float) -> None:
        self.plan = plan
        self.group_starter = group_starter
        self._seed = seed
        self._start_timeout = start_timeout
        self._group: RankGroup | None = None
        self._sampler: ResourceSampler | None = None
        self.devices: list[str] = []
        self._last_task = ""
        self.last_failed_rank: int | None = None  # the root cause of the last task that failed
        self._checking = False  # asking the ranks for their collective counts (after a bad task)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, output: str | Sink = "text") -> WorkerPool:
        """Fork the ranks and return once every rank has joined the process group (handshake).

        What the ranks print while starting goes to ``output`` (a sink, or a name for ``make_sink``).
        """
        seed = self._seed if self.group_starter.start_method == "fork" else None  # fork server, spawn: fresh namespaces
        _import_rank_modules()
        job = Job(serve, args=(seed,), pass_ends=True)
        group = self.group_starter.start_group(job, self.plan, attempt=0, persistent=True)
        try:
            self.devices = wait_until_ready(group, make_sink(output), self._start_timeout)
        except BaseException:
            group.close()
            raise
        self._group = group
        self._sampler = sampler_for(group)  # one for the pool's life: peaks span every cell
        _LIVE_POOLS.add(self)
        return self

    @property
    def alive(self) -> bool:
        return self._group is not None

    @property
    def shares_memory(self) -> bool:
        """Big values travel to and from these ranks as shared memory (they run on this machine)."""
        return self._require_group().shares_memory

    @property
    def num_processes(self) -> int:
        return self.plan.num_processes

    @property
    def start_method(self) -> str:
        """ "fork", "forkserver" or "spawn": how the workers were started (all but fork start with empty namespaces)."""
        return self.group_starter.start_method

    def stop(self, graceful: bool = True) -> None:
        """Tell every rank to leave (they tear down their process group and run their own atexit
        handlers), give them up to 2 s together plus the handlers' bound (``NBACCEL_EXIT_TIMEOUT``),
        then SIGKILL whatever is left; every rank is reaped. Nothing outlives this."""
        group, self._group = self._group, None
        if group is None:
            return
        _LIVE_POOLS.discard(self)
        try:
            if graceful:
                for rank in range(self.num_processes):
                    try:
                        group.send(rank, Kind.STOP, b"")
                    except OSError:
                        pass
                grace = _LEAVE_GRACE + exit_hooks.timeout()  # the ranks' own atexit handlers run first
                wait_until_ended(group, grace=grace)  # returns as soon as all ended
                lingering = [rank for rank in range(self.num_processes) if group.returncode(rank) is None]
                if lingering:
                    say(
                        f"rank(s) {', '.join(map(str, lingering))} did not leave the process group within {grace:g} s of the stop (stuck in destroy_process_group); killed them"
                    )
        finally:
            group.close()  # also after an interrupt while waiting: nothing outlives this

    def restart(self) -> WorkerPool:
        """Fresh worker processes with empty namespaces and the same options."""
        self.stop()
        self._seed = None
        return self.start()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<WorkerPool {self.plan.num_processes} ranks on {self.plan.device_type}, {state}>"

    # -- work ------------------------------------------------------------------------------------

    def run(
        self, function: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None, timeout: float | None = None, output: str | Sink | None = None
    ) -> Any:
        """Run ``function(*args)`` on the workers; every rank's value (a list, or a dict for ``ranks``)."""
        return self.run_task(
            CallFunction(Sourced.wrap(function), args), ranks=ranks, timeout=timeout, output=output, label=getattr(function, "__name__", "function")
        )

    def push(self, shard: bool | Callable[[Any, Any], Any] = False, mesh: Sequence[int] | None = None, **values: Any) -> None:
        """Bind ``values`` in every rank's namespace (cloudpickle carries them).

        ``shard=True``: each value (a module) is placed sharded over the ranks by FSDP2's
        ``fully_shard`` on a 1-D mesh, or ``mesh`` (``(dp, tp)``: HSDP, replicated over dp and
        sharded over tp), each rank receiving only its slices. ``shard=recipe``: ``recipe(module,
        mesh)`` shards it on each rank (``parallelize_module``, per-layer ``fully_shard``), and each
        rank copies its part from the full weights in shared memory (``nbaccel.pool.sharded``).
        """
        if shard:
            recipe = None if shard is True else shard
            if recipe is not None and not callable(recipe):
                raise TypeError(f"shard={shard!r} is neither True nor a callable recipe(module, mesh); pass shard=True for fully_shard, or a function")
            for name, value in values.items():
                sharded.shard_tasks(name, value, self.num_processes, mesh)  # refuses a non-module before anything is sent
            for name, value in values.items():
                sharded.push_sharded(self, name, value, mesh, recipe)
            return
        for name, value in values.items():  # one at a time, so a failure names the culprit
            try:
                _check_picklable(value)
            except Exception as exc:  # noqa: BLE001 - any pickling failure
                raise TypeError(
                    f"cannot push {name!r}: a {type(value).__qualname__} cannot be pickled ({exc}); push plain data, tensors or modules instead."
                ) from None
        self.run_task(Assign(values), output="text", label="push " + " ".join(values), remember=False)

    def pull(self, name: str, rank: int = 0) -> Any:
        """A variable of ``rank``'s namespace, with tensors moved to CPU (a module: its state_dict).

        A value holding DTensors (FSDP2, tensor parallel) is gathered on every rank and comes as
        full CPU tensors (``nbaccel.pool.sharded``)."""
        return sharded.pull(self, name, rank)

    def save(self, directory: str | os.PathLike[str], *names: str) -> str:
        """Save ``names`` (modules, optimizers, tensors, objects) with torch.distributed.checkpoint,
        atomically, into ``directory``; its absolute path. Loads on any number of ranks."""
        return sharded.save(self, directory, names)

    def load(self, directory: str | os.PathLike[str], *names: str) -> None:
        """Load ``names`` from a checkpoint ``save`` wrote (on any number of ranks), resharded as they are here."""
        sharded.load(self, directory, names)

    def status(self) -> list[WorkerStatus]:
        """Per rank: pid, device, idle or ended, memory in use, and the last cell it ran."""
        group = self._require_group()
        answers: dict[int, Any] = {}
        if not any(group.returncode(rank) is not None for rank in range(self.num_processes)):
            answers = self.run_task(RankStatus(), ranks=range(self.num_processes), output="text", label="", remember=False)
        samples = self._samples()
        return [self._status_of(rank, answers.get(rank), samples.get(rank)) for rank in range(self.num_processes)]

    def _samples(self) -> dict[int, dict[str, Any]]:
        """Each rank's resource sample now (CPU, memory, GPU), by rank: sampled here on one node."""
        return self._sampler.sample(time.monotonic()) if self._sampler is not None else {}

    def free(self) -> dict[int, dict[str, Any]]:
        """On every rank: ``gc.collect()``, then ``torch.cuda.empty_cache()`` where CUDA is in use;
        by rank, what each held before and after (``pool.worker_calls.FreeMemory``)."""
        answers: dict[int, dict[str, Any]] = self.run_task(FreeMemory(), ranks=range(self.num_processes), output="text", label="free", remember=False)
        return answers

    def stacks(self) -> list[RankStack]:
        """Where every worker is now: each thread's Python stack and a one-line summary, by rank.

        Between cells a rank's summary reads ``rank 0: idle, waiting for the next cell``.

        Example:
            >>> pool = start_local_workers(LaunchOptions(num_processes=2))
            >>> for stack in pool.stacks():  # doctest: +ELLIPSIS
            ...     print(stack.summary)
            rank 0: ...
            rank 1: ...
            >>> pool.stop()
        """
        group = self._require_group()
        found = group.stacks(range(self.num_processes))
        return [found[rank] for rank in sorted(found)]

    def run_task(
        self,
        task: Callable[[dict[str, Any]], Any],
        ranks: Sequence[int] | None = None,
        timeout: float | None = None,
        output: str | Sink | None = None,
        label: str = "",
        remember: bool = True,
    ) -> Any:
        """Send ``task`` (a callable over the rank's namespace) to ``ranks`` and collect the answers."""
        self._require_group()
        chosen = self._check_ranks(ranks)
        values = self.run_each(dict.fromkeys(chosen, task), timeout, output, label, remember)
        return [values[r] for r in chosen] if ranks is None else values

    def run_each(
        self,
        tasks: Mapping[int, Callable[[dict[str, Any]], Any]],
        timeout: float | None = None,
        output: str | Sink | None = None,
        label: str = "",
        remember: bool = True,
    ) -> dict[int, Any]:
        """Send each rank (the keys) its own task and collect the answers, by rank; one task for
        several ranks is pickled once. Each rank receives only its own (a sharded push: its slices)."""
        group = self._require_group()
        chosen = self._check_ranks(list(tasks))
        check_timeout(timeout)
        payloads: dict[int, tuple[bytes, Attachments | None]] = {}
        made: dict[int, tuple[bytes, Attachments | None]] = {}
        try:
            for rank in chosen:
                task = tasks[rank]
                if id(task) not in made:
                    attached = Attachments() if group.shares_memory else None
                    made[id(task)] = (_pickle_by_value(task, attached), attached)
                payloads[rank] = made[id(task)]
            self._check_alive(group)
            return self._run_sent(group, chosen, payloads, timeout, output, label, remember)
        finally:
            for _, attached in made.values():
                if attached is not None:
                    attached.close()  # each rank has its own fds by now

    def _run_sent(
        self,
        group: RankGroup,
        chosen: list[int],
        payloads: dict[int, tuple[bytes, Attachments | None]],
        timeout: float | None,
        output: str | Sink | None,
        label: str,
        remember: bool,
    ) -> dict[int, Any]:
        """The task's payload is made: send it and run the loop until every chosen rank answered."""
        sink = make_sink(output)
        if remember:
            self._last_task = label
        elif isinstance(sink, RichTextSink):
            sink.closing_figures = False  # a push, pull or status is housekeeping: the ranks' peaks are not its news
        policy = Task()
        with SinkSession(sink, self.num_processes, 0, ranks=chosen) as session:
            for rank in chosen:  # the workers are up already: their chips say running at once
                sink.event(rank, rich.started_event(group.pid(rank)))
            deadline = None if timeout is None else time.monotonic() + timeout
            loop = session.watch(
                EventLoop(group, sink, policy, ranks=chosen, deadline=deadline, timeout=timeout, stall_report=self.plan.stall_report, sampler=self._sampler)
            )
            self._send(group, chosen, payloads)
            loop.run()
        self._raise_for(loop, policy, timeout)
        return {o.rank: o.value for o in loop.outcome_list()}

    def debug(self, rank: int | None = None, output: str | Sink | None = None) -> None:
        """Open the post-mortem of ``rank``'s last failed cell, in its frames (``%distributed debug``).

        ``rank`` defaults to the rank that failed last. The prompt is the cell's stdin, as at a
        breakpoint (docs/debugging.md); ``q`` or ``c`` ends it; the namespaces are kept.

        Example::

            pool.run(lambda: 1 / 0)   # RankFailedError: rank 0 failed: ZeroDivisionError ...
            pool.debug()              # (Pdb) rank 0> p locals() ...
        """
        chosen = self.last_failed_rank if rank is None else rank
        if chosen is None:
            raise LookupError("no cell has failed on these workers yet: there is nothing to debug (pass rank=N to look at a rank's last failure).")
        if not self.run_task(DebugLastFailure(), ranks=[chosen], output=output, label="debug", remember=False)[chosen]:
            raise LookupError(f"rank {chosen} has no failed cell to debug: its cells have not raised since the workers started.")

    # -- internals -------------------------------------------------------------------------------

    def _require_group(self) -> RankGroup:
        if self._group is None:
            raise PoolStoppedError("the workers are not running; start them with nbaccel.start_workers(...) or %distributed start.")
        return self._group

    def _check_ranks(self, ranks: Sequence[int] | None) -> list[int]:
        if ranks is None:
            return list(range(self.num_processes))
        chosen = sorted({int(r) for r in ranks})
        outside = [r for r in chosen if not 0 <= r < self.num_processes]
        if not chosen or outside:
            raise ValueError(f"ranks {list(ranks)!r} are not all in this pool of {self.num_processes} ranks (0..{self.num_processes - 1}).")
        return chosen

    def _check_alive(self, group: RankGroup) -> None:
        dead = [rank for rank in range(self.num_processes) if group.returncode(rank) is not None]
        if dead:
            ended = ", ".join(f"rank {rank}: {exit_words(group.returncode(rank) or 0)}" for rank in dead)
            self.stop()
            raise PoolStoppedError(f"worker(s) ended while idle: {ended}; the pool was stopped. Start new workers.")

    def _send(self, group: RankGroup, ranks: list[int], payloads: dict[int, tuple[bytes, Attachments | None]]) -> None:
        try:
            for rank in ranks:
                group.send(rank, Kind.TASK, *payloads[rank])
        except BaseException:  # a half-sent task leaves the command stream unusable
            self.stop()
            raise

    def _raise_for(self, loop: EventLoop, policy: Task, timeout: float | None) -> None:
        outcomes = loop.outcome_list()
        if policy.exited or policy.stuck(loop):
            self._tear_down(loop, policy, timeout)
        elif (loop.stop_reason is not None or root_cause(outcomes) is not None) and not self._checking:
            self._keep_only_if_sound(outcomes)
        if loop.stop_reason is Status.INTERRUPTED:
            raise KeyboardInterrupt(where_ranks_were(outcomes))
        if loop.stop_reason is Status.TIMED_OUT and not any(o.status is Status.FAILED for o in outcomes):
            raise LaunchTimeoutError(timeout or 0.0, loop.running_at_timeout, outcomes, what="the cell on the workers")
        root = root_cause(outcomes)
        if root is not None:
            self.last_failed_rank = root.rank
            raise RankFailedError(root, outcomes)

    def _keep_only_if_sound(self, outcomes: list[RankOutcome]) -> None:
        """After a task that failed or was stopped: stop the workers when they cannot go on.

        A rank whose CUDA context died fails every later cell; ranks that issued different
        numbers of collectives would pair the wrong ones in the next cell (nbaccel.pool.in_step).
        """
        dead = ranks_with_dead_cuda(outcomes)
        why = dead_cuda_notice(dead) if dead else self._out_of_step()
        if why is not None and self.alive:
            self.stop(graceful=False)
            say(why)

    def _out_of_step(self) -> str | None:
        """Why the workers' process group cannot be trusted any more, or None when it can."""
        self._checking = True  # the check is a task too: its own outcome is not checked again
        try:
            counts = self.run_task(CollectiveCount(), ranks=range(self.num_processes), output=CollectingSink(), remember=False, timeout=_COUNT_TIMEOUT)
        except (NbaccelError, KeyboardInterrupt) as exc:  # workers that cannot even answer this
            return f"the workers could not say how many collectives they issued ({type(exc).__name__}); the workers were stopped. Start new ones (%distributed start)."
        finally:
            self._checking = False
        step = out_of_step(counts)
        return None if step is None else f"{step}; the workers were stopped. Start new ones (%distributed start)."

    def _tear_down(self, loop: EventLoop, policy: Task, timeout: float | None) -> None:
        """A rank died or is stuck: the process group cannot be trusted; stop every rank."""
        crashed = [o for o in policy.exited if o.rank >= 0]
        stuck = policy.stuck(loop)
        for outcome in loop.outcomes.values():
            if outcome.status is Status.RUNNING:
                outcome.status = Status.STOPPED
        self.stop(graceful=False)
        if crashed:
            states = [*crashed, *(o for o in loop.outcomes.values() if o.rank not in {c.rank for c in crashed})]
            error = RankFailedError(crashed[0], sorted(states, key=lambda o: o.rank))
            say(f"{crashed[0].describe()}; the workers were stopped. Start new ones.")
            raise error
        reason = (
            f"rank(s) {', '.join(map(str, stuck))} did not stop within {policy.grace:g} s of the interrupt (stuck in a collective or native code)"
            if stuck
            else "interrupted twice"
        )
        say(f"{reason}; the workers were stopped. Start new ones (%distributed start).")
        if not stuck:
            raise KeyboardInterrupt(f"{reason}; the workers were stopped")
        raise_stuck_error(loop, reason, timeout)

    def _status_of(self, rank: int, answer: Any, sample: dict[str, Any] | None = None) -> WorkerStatus:
        group = self._require_group()
        code = group.returncode(rank)
        state = "idle" if code is None else exit_words(code)
        return WorkerStatus(
            rank=rank,
            pid=group.pid(rank),
            device=self.devices[rank] if rank < len(self.devices) else "?",
            state=state,
            memory_mb=(answer or {}).get("memory_mb") or _resident_mb(group.pid(rank)),  # the rank's own word: it may be remote
            device_memory_mb=(answer or {}).get("device_memory_mb"),
            last_cell=self._last_task,
            cpu_percent=None if sample is None else sample["cpu"],
            peak_memory_mb=None if sample is None else sample["peak_rss"] / 2**20,
            device_reserved_mb=(answer or {}).get("device_reserved_mb"),
            device_used_mb=(answer or {}).get("device_used_mb"),
            shards=(answer or {}).get("shards") or {},
            **_gpu_figures(sample),
        )


def _gpu_figures(sample: dict[str, Any] | None) -> dict[str, float | None]:
    """The sampler's NVML figures of a rank on a GPU, for ``WorkerStatus`` (none for CPU ranks)."""
    sample = sample or {}
    held, peak = sample.get("gpu_mem"), sample.get("peak_gpu_mem")
    return {
        "gpu_held_mb": None if held is None else held / 2**20,
        "gpu_peak_mb": None if peak is None else peak / 2**20,
        "gpu_util": sample.get("gpu_util"),
    }


def _import_rank_modules() -> None:
    """Import in the kernel, once, what every forked rank needs: each rank would import it again."""
    from nbaccel import state  # noqa: F401
    from nbaccel.state import lazy  # noqa: F401  # every worker's predefined `state`


def _check_picklable(value: Any) -> None:
    import cloudpickle

    shm.check_picklable(value, cloudpickle.Pickler)  # a 1 GiB tensor is not copied to find out


def _pickle_by_value(value: Any, attached: Attachments | None = None) -> bytes:
    """cloudpickle: what the notebook defined after the workers forked exists only in the kernel,
    so it must travel by value (plain pickle would name ``__main__.f``, unknown on the rank).
    With ``attached``, big tensors and arrays go into memfds, one for every rank (nbaccel.wire.shm)."""
    import cloudpickle

    if attached is None:
        payload: bytes = cloudpickle.dumps(value)
        return payload
    return shm.dumps(value, attached, base=cloudpickle.Pickler)


def _resident_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def start_local_workers(options: LaunchOptions, namespace: dict[str, Any] | None = None, start_timeout: float = 120.0) -> WorkerPool:
    """Fork persistent workers on this machine as ``options`` say and return when every rank has
    joined the process group.

    ``nbaccel.start_workers`` (``nbaccel/launcher.py``) checks its arguments into ``options`` and
    runs this, or a pool across nodes for ``cluster=``.

    Args:
        options: the checked launch options (ranks, devices, start method, stall report).
        namespace: what every rank's namespace starts as (a copy, made by the fork); the magic
            passes the notebook's. Ignored under spawn and the fork server: those ranks start empty.
        start_timeout: seconds to wait for every rank to be ready.

    Example:
        >>> pool = start_local_workers(LaunchOptions(num_processes=2))
        >>> pool.run(lambda: 1)
        [1, 1]
        >>> pool.stop()
    """
    plan = make_plan(options, time.monotonic())
    return WorkerPool(plan, LocalGroupStarter(choose_starter(options.start_method, plan.num_processes)), namespace, start_timeout).start()


@atexit.register
def _stop_every_pool() -> None:
    """At kernel shutdown: stop (and reap) every pool, so nothing holds the shutdown up."""
    for pool in list(_LIVE_POOLS):
        pool.stop(graceful=False)
