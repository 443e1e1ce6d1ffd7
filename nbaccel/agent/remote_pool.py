"""Persistent workers across the nodes of a ``Cluster``: one process group that stays, cell after cell.

Every rank of every node runs the same rank-side loop as a one-node pool (``nbaccel.pool.serve``):
it joins the process group once, says READY, then runs the tasks the kernel sends (through its
agent, signed) in a namespace that lives as long as the worker. The kernel side keeps the launch
open for the pool's lifetime; a failing or interrupted task leaves the workers alive, a rank
that dies or a node that is lost stops the pool.

Example::

    with ClusterPool(cluster).start() as pool:
        pool.push(scale=10)
        pool.run(lambda: int(os.environ["RANK"]))     # [0, 1, 2, 3]
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from typing import Any

from nbaccel.agent import protocol
from nbaccel.agent.cluster import Cluster, NodeInfo
from nbaccel.agent.remote import NodeRankFailedError, RemoteLaunch, begin_launch, cluster_plan
from nbaccel.errors import LaunchTimeoutError, NbaccelError
from nbaccel.launch.outcome import RankOutcome, RemoteError, Status, root_cause, undecodable_result
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import Sink, TextSink
from nbaccel.pool.serve import serve
from nbaccel.pool.tasks import Assign, CallFunction, Fetch
from nbaccel.rank.bootstrap import Job
from nbaccel.wire import frames as channel
from nbaccel.wire.portable import Sourced

INTERRUPT_GRACE = 10.0


class ClusterPoolStoppedError(NbaccelError):
    """The pool across nodes is gone (stopped, or torn down after a rank or node was lost)."""


class _PoolWatch:
    """Reads the pool's messages until ``done``: READY during start-up, one task's answers after."""

    def __init__(self, running: RemoteLaunch, sink: Sink, ranks: list[int], deadline: float | None) -> None:
        self.running = running
        self.sink = sink
        self.ranks = ranks
        self.deadline = deadline
        self.outcomes = {r: RankOutcome(r) for r in ranks}
        self.ready: dict[int, str] = {}
        self.broken: list[RankOutcome] = []  # ranks that exited or whose node was lost
        self.reason: Status | None = None
        self.running_at_timeout: dict[int, str] = {}
        self._grace_ends: float | None = None
        self._last_lines: dict[int, list[str]] = {}
        self._node_of = {rank: slot for slot in running.slots for rank in slot.ranks}

    @property
    def stuck(self) -> list[int]:
        if self._grace_ends is None or time.monotonic() < self._grace_ends:
            return []
        return [r for r, o in self.outcomes.items() if o.status is Status.RUNNING]

    def loop(self, until: Callable[[], bool]) -> None:
        while not (self.broken or self.stuck or until()):
            moments = [m for m in (self.deadline if self._grace_ends is None else self._grace_ends,) if m is not None]
            wait = max(0.0, min(moments) - time.monotonic()) if moments else 0.5
            try:
                kind, node, item = self.running.inbox.get(timeout=wait)
            except queue.Empty:
                pass
            else:
                self._handle(kind, node, item)
            if self.deadline is not None and self._grace_ends is None and time.monotonic() >= self.deadline:
                self.running_at_timeout = {r: (self._last_lines.get(r) or [""])[-1] for r, o in self.outcomes.items() if o.status is Status.RUNNING}
                self.interrupt(Status.TIMED_OUT)

    def answered(self) -> bool:
        return all(o.status is not Status.RUNNING for o in self.outcomes.values())

    def interrupt(self, reason: Status) -> None:
        """SIGINT every rank still busy (the task unwinds, the worker stays); grace to answer."""
        if self.reason is None or reason is Status.INTERRUPTED:
            self.reason = reason
        if self._grace_ends is not None:
            return
        self._grace_ends = time.monotonic() + INTERRUPT_GRACE
        busy = [r for r, o in self.outcomes.items() if o.status is Status.RUNNING]
        for slot in self.running.slots:
            mine = [r for r in busy if r in slot.ranks]
            if mine:
                self.running.cluster.send(slot.node, protocol.SIGNAL, {"ranks": mine, "signal": 2}, self.running.launch)

    def _handle(self, kind: str, node: NodeInfo, item: Any) -> None:
        if kind == "lost":
            slot = next(s for s in self.running.slots if s.node is node)
            error = RemoteError("NodeLostError", f"{slot.where()} {item}; its ranks {', '.join(map(str, slot.ranks))} are lost", "", time.time())
            self.broken += [RankOutcome(r, Status.FAILED, error=error) for r in slot.ranks]
            return
        message = item
        if message.kind == protocol.LINES:
            body = message.json()
            self._last_lines.setdefault(body["rank"], []).extend(body["lines"])
            del self._last_lines[body["rank"]][:-20]
            self.sink.output(body["rank"], body["stream"], body["lines"])
        elif message.kind == protocol.FRAME:
            self._on_frame(*protocol.unpack_frame(message.payload))
        elif message.kind == protocol.EXITED:
            body = message.json()
            code = int(body["returncode"] if body["returncode"] is not None else 255)
            outcome = RankOutcome(int(body["rank"]), Status.SIGNALED if code < 0 else Status.EXITED, exitcode=code if code >= 0 else None, signal=-code if code < 0 else None)
            outcome.last_lines = list(self._last_lines.get(outcome.rank, []))
            self.broken.append(outcome)
            self.sink.rank_finished(outcome)

    def _on_frame(self, rank: int, kind_number: int, payload: bytes) -> None:
        kind = channel.Kind(kind_number)
        if kind is channel.Kind.READY:
            self.ready[rank] = channel.loads(payload)["device"]
            return
        if kind is channel.Kind.EVENT:
            self.sink.event(rank, channel.loads(payload))
            return
        outcome = self.outcomes.get(rank)
        if outcome is None or kind not in (channel.Kind.RESULT, channel.Kind.ERROR):
            return
        outcome.last_lines = list(self._last_lines.get(rank, []))
        if kind is channel.Kind.RESULT:
            try:
                outcome.value, outcome.status = channel.loads(payload), Status.SUCCEEDED
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is that rank's
                outcome.error, outcome.status = undecodable_result(rank, exc), Status.FAILED
        else:
            outcome.error = RemoteError.from_fields(channel.loads(payload))
            if self.reason is not None and outcome.error.type_name == "KeyboardInterrupt":
                outcome.status = self.reason
            else:
                outcome.status = Status.FAILED
                self.interrupt(Status.STOPPED)  # peers may wait for it in a collective
        self.sink.rank_finished(outcome)


class ClusterPool:
    """Workers on every node of ``cluster`` that keep their process group and namespaces."""

    def __init__(self, cluster: Cluster, cpu: bool = False, mixed_precision: str = "no", start_timeout: float = 120.0) -> None:
        self.cluster = cluster
        self.plan = cluster_plan(cluster, mixed_precision, None, 0, cpu, time.monotonic())
        self._start_timeout = start_timeout
        self._running: RemoteLaunch | None = None
        self.devices: list[str] = []

    def start(self) -> ClusterPool:
        """Start a worker on every rank of every node; return when all joined the process group."""
        running = begin_launch(self.cluster, Job(serve, args=(None,), pass_ends=True), self.plan, 0)
        watch = _PoolWatch(running, TextSink(), [], time.monotonic() + self._start_timeout)
        try:
            watch.loop(lambda: len(watch.ready) == running.world)
            if len(watch.ready) < running.world:
                raise self._start_failure(watch, running)
        except BaseException:
            self._running = running
            self.stop(graceful=False)
            raise
        self._running = running
        self.devices = [watch.ready[r] for r in range(running.world)]
        return self

    def _start_failure(self, watch: _PoolWatch, running: RemoteLaunch) -> Exception:
        if watch.broken:
            root = root_cause(watch.broken) or watch.broken[0]
            return NodeRankFailedError(root, watch.broken, {r: s.where() for s in running.slots for r in s.ranks})
        waiting = {r: "" for r in range(running.world) if r not in watch.ready}
        return LaunchTimeoutError(self._start_timeout, waiting, [])

    @property
    def alive(self) -> bool:
        return self._running is not None

    @property
    def num_processes(self) -> int:
        return self._running.world if self._running is not None else 0

    def run(self, function: Callable[..., Any], *args: Any, ranks: Sequence[int] | None = None, timeout: float | None = None, output: str | Sink | None = None) -> Any:
        """``function(*args)`` on the workers; every rank's value (a list, or a dict for ``ranks``)."""
        return self.run_task(CallFunction(Sourced.wrap(function), args), ranks, timeout, output)

    def push(self, **values: Any) -> None:
        """Bind ``values`` in every rank's namespace."""
        self.run_task(Assign(values), output="text")

    def pull(self, name: str, rank: int = 0) -> Any:
        """A variable of ``rank``'s namespace (tensors on CPU)."""
        return self.run_task(Fetch(name), ranks=[rank], output="text")[rank]

    def run_task(self, task: Callable[[dict[str, Any]], Any], ranks: Sequence[int] | None = None, timeout: float | None = None, output: str | Sink | None = None) -> Any:
        """Send ``task`` to ``ranks`` (default: all) and collect their answers."""
        import cloudpickle

        running = self._require()
        chosen = list(range(running.world)) if ranks is None else sorted({int(r) for r in ranks})
        if not chosen or any(not 0 <= r < running.world for r in chosen):
            raise ValueError(f"ranks {ranks!r} are not all in this pool of {running.world} ranks (0..{running.world - 1}).")
        payload = cloudpickle.dumps(task)
        sink = make_sink(output)
        sink.launch_started(running.world, 0, ranks=chosen)
        watch = _PoolWatch(running, sink, chosen, None if timeout is None else time.monotonic() + timeout)
        for slot in running.slots:
            for rank in (r for r in chosen if r in slot.ranks):
                self.cluster.send(slot.node, protocol.COMMAND, launch=running.launch, raw=protocol.pack_frame(rank, int(channel.Kind.TASK), payload))
        try:
            watch.loop(watch.answered)
        except KeyboardInterrupt:
            watch.interrupt(Status.INTERRUPTED)
            watch.loop(watch.answered)
        outcomes = [watch.outcomes[r] for r in chosen]
        sink.launch_finished(outcomes)
        return self._result(watch, running, outcomes, chosen, ranks is None, timeout)

    def _result(self, watch: _PoolWatch, running: RemoteLaunch, outcomes: list[RankOutcome], chosen: list[int], as_list: bool, timeout: float | None) -> Any:
        where = {r: s.where() for s in running.slots for r in s.ranks}
        if watch.broken or watch.stuck:
            self.stop(graceful=False)
            if watch.broken:
                raise NodeRankFailedError(root_cause(watch.broken) or watch.broken[0], watch.broken, where)
            raise ClusterPoolStoppedError(f"rank(s) {watch.stuck} did not answer within {INTERRUPT_GRACE:g} s of the interrupt; the pool was stopped. Start a new one.")
        if watch.reason is Status.INTERRUPTED:
            raise KeyboardInterrupt
        root = root_cause(outcomes)
        if root is not None:
            raise NodeRankFailedError(root, outcomes, where)
        if watch.reason is Status.TIMED_OUT:
            raise LaunchTimeoutError(timeout or 0.0, watch.running_at_timeout, outcomes)
        values = {o.rank: o.value for o in outcomes}
        return [values[r] for r in chosen] if as_list else values

    def stop(self, graceful: bool = True) -> None:
        """Every worker leaves (its process group torn down); within 3 s nothing is left on any node."""
        running, self._running = self._running, None
        if running is None:
            return
        try:
            if graceful:
                for slot in running.slots:
                    for rank in slot.ranks:
                        self.cluster.send(slot.node, protocol.COMMAND, launch=running.launch, raw=protocol.pack_frame(rank, int(channel.Kind.STOP), b""))
            else:
                for slot in running.slots:
                    self.cluster.send(slot.node, protocol.STOP, {"reason": "stopped"}, running.launch)
            self._wait_finished(running, deadline=time.monotonic() + 3.0)
        finally:
            running.close()

    def _wait_finished(self, running: RemoteLaunch, deadline: float) -> None:
        left = {id(s.node) for s in running.slots if s.node.alive}
        stopping = False
        while left:
            now = time.monotonic()
            if now >= deadline and stopping:
                return
            if now >= deadline - 2.0 and not stopping:  # a worker that does not leave is stopped
                for slot in running.slots:
                    self.cluster.send(slot.node, protocol.STOP, {"reason": "stopped"}, running.launch)
                stopping = True
            try:
                kind, node, item = running.inbox.get(timeout=0.1)
            except queue.Empty:
                continue
            if kind == "lost" or item.kind == protocol.FINISHED:
                left.discard(id(node))

    def _require(self) -> RemoteLaunch:
        if self._running is None:
            raise ClusterPoolStoppedError("the pool across nodes is not running; start one with start_workers(cluster=...).")
        return self._running

    def __enter__(self) -> ClusterPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"{self.num_processes} ranks on {len(self._running.slots)} nodes" if self._running else "stopped"
        return f"<ClusterPool at {self.cluster.address}: {state}>"
