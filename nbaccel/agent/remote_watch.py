"""The policy of one launch across nodes, in the kernel: outcomes, root cause, stops, lost nodes.

The same rules as a one-node launch (``nbaccel.supervisor``), applied to what the agents report:
a rank's result or error, its exit status, a node's end. A failure anywhere stops every rank on
every node at once; a node that stops answering fails the launch naming the node and its ranks.
Every verified message arrives on the launch's queue from the cluster's thread; this loop runs
in the cell's thread, so the sinks are fed there, as on one node.

Example::

    outcomes = RemoteWatch(cluster, layout, inbox, sink, deadline=None, timeout=None).run()
"""

from __future__ import annotations

import collections
import queue
import time
from dataclasses import dataclass, field
from typing import Any

from nbaccel.agent import protocol
from nbaccel.agent.cluster import Cluster, NodeInfo
from nbaccel.errors import LaunchTimeoutError
from nbaccel.launch.outcome import RankOutcome, RemoteError, Status, undecodable_result
from nbaccel.output.sinks import Sink
from nbaccel.wire import frames as channel

_LAST_LINES = 20
_INTERRUPT_GRACE = 5.0  # an interrupted launch returns within this long, every node's ranks stopped
_STOP_GRACE = 6.0  # a node that has not finished this long after a stop is given up on

REASONS = {Status.STOPPED: "stopped", Status.TIMED_OUT: "timed out", Status.INTERRUPTED: "interrupted"}


@dataclass
class NodeSlot:
    """One node's part in a launch: its global ranks, and whether it is done."""

    node: NodeInfo
    node_rank: int
    ranks: list[int]
    done: bool = False
    lost: bool = False
    pids: list[int] = field(default_factory=list)

    def where(self) -> str:
        return f"node {self.node_rank} ({self.node.host}, {self.node.address})"


class RemoteWatch:
    """Runs one launch across nodes until every node has finished or is lost."""

    def __init__(self, cluster: Cluster, launch: str, slots: list[NodeSlot], inbox: queue.Queue[tuple[str, NodeInfo, Any]], sink: Sink, deadline: float | None, timeout: float | None) -> None:
        self.cluster = cluster
        self.launch = launch
        self.slots = slots
        self.inbox = inbox
        self.sink = sink
        self.deadline = deadline
        self.timeout = timeout
        world = sum(len(s.ranks) for s in slots)
        self.outcomes = [RankOutcome(rank=r) for r in range(world)]
        self.signals_sent: dict[int, list[int]] = {r: [] for r in range(world)}
        self.exited: set[int] = set()
        self.last_lines: dict[int, collections.deque[str]] = {r: collections.deque(maxlen=_LAST_LINES) for r in range(world)}
        self.slot_of = {rank: slot for slot in slots for rank in slot.ranks}
        self._by_node = {id(s.node): s for s in slots}
        self._stop_reason: Status | None = None
        self._give_up_at: float | None = None
        self._running_at_timeout: dict[int, str] = {}

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> list[RankOutcome]:
        try:
            self._loop()
        except KeyboardInterrupt:
            self._stop(Status.INTERRUPTED)
            self._give_up_at = time.monotonic() + _INTERRUPT_GRACE
            self._loop()
            raise
        if self._stop_reason is Status.TIMED_OUT:
            raise LaunchTimeoutError(self.timeout or 0.0, self._running_at_timeout, self.outcomes)
        return self.outcomes

    def _loop(self) -> None:
        while not all(s.done for s in self.slots):
            try:
                kind, node, item = self.inbox.get(timeout=self._wait_time())
            except queue.Empty:
                pass
            else:
                self._handle(kind, node, item)
            self._on_clock(time.monotonic())

    def _wait_time(self) -> float:
        moments = [m for m in (self.deadline if self._stop_reason is None else None, self._give_up_at) if m is not None]
        tick_in = getattr(self.sink, "tick_in", None)
        due = tick_in() if tick_in is not None else None
        if due is not None:
            moments.append(time.monotonic() + due)
        return max(0.0, min(moments) - time.monotonic()) if moments else 0.5

    def _on_clock(self, now: float) -> None:
        tick_in = getattr(self.sink, "tick_in", None)
        if tick_in is not None and (tick_in() or 0) <= 0:
            self.sink.tick()  # type: ignore[attr-defined]
        if self.deadline is not None and self._stop_reason is None and now >= self.deadline:
            self._running_at_timeout = {o.rank: (self.last_lines[o.rank][-1] if self.last_lines[o.rank] else "") for o in self.outcomes if o.status is Status.RUNNING}
            self._stop(Status.TIMED_OUT)
        if self._give_up_at is not None and now >= self._give_up_at:
            for slot in self.slots:
                if not slot.done:
                    self._end_node(slot, f"did not stop its ranks within {_STOP_GRACE:g} s", lost=True)

    # -- messages ------------------------------------------------------------------------------

    def _handle(self, kind: str, node: NodeInfo, item: Any) -> None:
        slot = self._by_node.get(id(node))
        if slot is None or slot.done:
            return
        if kind == "lost":
            self._end_node(slot, str(item), lost=True)
            return
        message = item
        if message.kind == protocol.LINES:
            body = message.json()
            rank = int(body["rank"])
            if rank in slot.ranks:
                self.last_lines[rank].extend(body["lines"])
                self.sink.output(rank, body["stream"], body["lines"])
        elif message.kind == protocol.FRAME:
            rank, frame_kind, payload = protocol.unpack_frame(message.payload)
            if rank in slot.ranks:
                self._on_frame(rank, channel.Kind(frame_kind), payload)
        elif message.kind == protocol.EXITED:
            body = message.json()
            if int(body["rank"]) in slot.ranks:
                self._on_exit(int(body["rank"]), body["returncode"], body["signals_sent"])
        elif message.kind == protocol.STARTED:
            slot.pids = list(message.json()["pids"])
        elif message.kind == protocol.FINISHED:
            slot.done = True
        elif message.kind == protocol.FAILED:
            self._end_node(slot, f"could not start its ranks: {message.json()['message']}", lost=False)

    def _on_frame(self, rank: int, kind: channel.Kind, payload: bytes) -> None:
        outcome = self.outcomes[rank]
        if kind is channel.Kind.RESULT:
            try:
                outcome.value = channel.loads(payload)
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is that rank's
                outcome.error, outcome.status = undecodable_result(rank, exc), Status.FAILED
                self._stop(Status.STOPPED)
                return
            outcome.status = Status.SUCCEEDED
            if all(o.status is Status.SUCCEEDED for o in self.outcomes):
                self._broadcast(protocol.RELEASE)
        elif kind is channel.Kind.ERROR:
            outcome.error = RemoteError.from_fields(channel.loads(payload))
            if not (self._stop_reason is not None and (outcome.error.is_peer_error or outcome.error.type_name == "KeyboardInterrupt")):
                outcome.status = Status.FAILED
                self._stop(Status.STOPPED, spare=rank)
        elif kind is channel.Kind.EVENT:
            self.sink.event(rank, channel.loads(payload))

    def _on_exit(self, rank: int, code: int | None, signals_sent: list[int]) -> None:
        """As ``Supervisor.on_exit``: decide how a rank ended from its exit status and reports."""
        outcome = self.outcomes[rank]
        self.exited.add(rank)
        self.signals_sent[rank] = signals_sent
        code = 255 if code is None else int(code)
        outcome.last_lines = list(self.last_lines[rank])
        outcome.exitcode = code if code >= 0 else None
        outcome.signal = -code if code < 0 else None
        if outcome.status is Status.SUCCEEDED and code != 0 and not signals_sent:
            outcome.status = Status.EXITED
        if outcome.status is Status.RUNNING:
            if self._stop_reason is not None and (signals_sent or outcome.error is not None):
                outcome.status = self._stop_reason
            else:
                outcome.status = Status.SIGNALED if code < 0 else Status.EXITED
        self.sink.rank_finished(outcome)
        if outcome.is_failure:
            self._stop(Status.STOPPED)

    def _end_node(self, slot: NodeSlot, reason: str, lost: bool) -> None:
        """A node is gone (or could not start): its unfinished ranks fail naming it, the rest stop."""
        slot.done, slot.lost = True, lost
        running = [r for r in slot.ranks if r not in self.exited]
        if not running:
            return
        error = RemoteError("NodeLostError" if lost else "NodeStartError", f"{slot.where()} {reason}; its ranks {', '.join(map(str, running))} are lost", "", time.time())
        for rank in running:
            outcome = self.outcomes[rank]
            outcome.last_lines = list(self.last_lines[rank])
            if outcome.status is not Status.RUNNING:
                pass  # it returned before its node went: keep its value
            elif self._stop_reason is None:
                outcome.status, outcome.error = Status.FAILED, error
            else:
                outcome.status = self._stop_reason
            self.exited.add(rank)
            self.sink.rank_finished(outcome)
        self._stop(Status.STOPPED)

    # -- stopping ------------------------------------------------------------------------------

    def _stop(self, reason: Status, spare: int | None = None) -> None:
        """Stop every rank on every node; an interrupt overrides a stop already under way."""
        if self._stop_reason is Status.INTERRUPTED or (self._stop_reason is not None and reason is not Status.INTERRUPTED):
            return
        self._stop_reason = reason
        if self._give_up_at is None:
            self._give_up_at = time.monotonic() + _STOP_GRACE
        self._broadcast(protocol.STOP, {"reason": REASONS[reason], "spare": spare})

    def _broadcast(self, kind: str, body: Any = None) -> None:
        for slot in self.slots:
            if not slot.done:
                self.cluster.send(slot.node, kind, body, self.launch)
