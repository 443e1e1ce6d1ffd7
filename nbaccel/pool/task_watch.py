"""The policy of one task on persistent workers: wait for the chosen ranks' answers, keep the pool.

Unlike a one-shot launch, a failing or interrupted task must leave the workers alive: the other
busy ranks get SIGINT (Python code and sleeps unwind with KeyboardInterrupt and report it), and
only ranks that do not answer within INTERRUPT_GRACE seconds (stuck in a collective or native
code) make the pool unusable. A rank that exits is a broken pool at once.

Example::

    watch = TaskWatch(processes, pipes, sink, ranks=[0, 1], deadline=None)
    watch.loop()
"""

from __future__ import annotations

import signal
import time

from nbaccel.wire import frames as channel
from nbaccel.launch.outcome import RankOutcome, RemoteError, Status, undecodable_result
from nbaccel.launch.pipes import RankPipes
from nbaccel.output.sinks import Sink
from nbaccel.launch.processes import RankProcess
from nbaccel.launch.loop import RankWatch

INTERRUPT_GRACE = 10.0


class TaskWatch(RankWatch):
    """Collects one task's answer from each rank in ``ranks``."""

    def __init__(self, processes: list[RankProcess], pipes: list[RankPipes], sink: Sink, ranks: list[int], deadline: float | None) -> None:
        super().__init__(processes, pipes, sink)
        self.ranks = ranks
        self.deadline = deadline
        self.outcomes = {rank: RankOutcome(rank) for rank in ranks}
        self.exited: list[RankOutcome] = []  # ranks whose process ended: the pool is broken
        self.reason: Status | None = None  # why we interrupted: INTERRUPTED, TIMED_OUT or STOPPED
        self.running_at_timeout: dict[int, str] = {}
        self.grace = INTERRUPT_GRACE
        self._grace_ends: float | None = None

    @property
    def stuck(self) -> list[int]:
        """Ranks that did not answer within the grace after SIGINT."""
        if self._grace_ends is None or time.monotonic() < self._grace_ends:
            return []
        return [r for r, o in self.outcomes.items() if o.status is Status.RUNNING]

    def done(self) -> bool:
        if self.exited or self.stuck:
            return True
        return all(o.status is not Status.RUNNING for o in self.outcomes.values())

    def interrupt(self, reason: Status) -> None:
        """SIGINT every rank still busy with the task; they have INTERRUPT_GRACE seconds to answer."""
        if self.reason is None or reason is Status.INTERRUPTED:
            self.reason = reason
        if self._grace_ends is None:
            self._grace_ends = time.monotonic() + self.grace
            busy = [self.processes[r] for r, o in self.outcomes.items() if o.status is Status.RUNNING]
            self.signal(signal.SIGINT, busy)

    def next_deadline(self) -> float | None:
        if self._grace_ends is not None:
            return self._grace_ends
        return self.deadline

    def on_clock(self, now: float) -> None:
        if self.deadline is not None and self._grace_ends is None and now >= self.deadline:
            self.running_at_timeout = {
                r: (self.pipes[r].last_lines[-1] if self.pipes[r].last_lines else "")
                for r, o in self.outcomes.items()
                if o.status is Status.RUNNING
            }
            self.interrupt(Status.TIMED_OUT)

    def on_frame(self, rank: int, kind: channel.Kind, payload: bytes) -> None:
        outcome = self.outcomes.get(rank)
        if kind is channel.Kind.EVENT or outcome is None:
            super().on_frame(rank, kind, payload)
            return
        outcome.last_lines = list(self.pipes[rank].last_lines)
        if kind is channel.Kind.RESULT:
            try:
                outcome.value = channel.loads(payload)
                outcome.status = Status.SUCCEEDED
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is that rank's
                outcome.error = undecodable_result(rank, exc)
                outcome.status = Status.FAILED
        elif kind is channel.Kind.ERROR:
            outcome.error = RemoteError.from_fields(channel.loads(payload))
            if self.reason is not None and outcome.error.type_name == "KeyboardInterrupt":
                outcome.status = self.reason  # our own SIGINT, answered
            else:
                outcome.status = Status.FAILED
                self.interrupt(Status.STOPPED)  # peers may wait for it in a collective
        self.sink.rank_finished(outcome)

    def on_exit(self, rank: int) -> None:
        proc = self.processes[rank]
        code = proc.returncode
        assert code is not None
        outcome = self.outcomes.get(rank) or RankOutcome(rank)
        outcome.exitcode = code if code >= 0 else None
        outcome.signal = -code if code < 0 else None
        outcome.status = Status.SIGNALED if code < 0 else Status.EXITED
        outcome.last_lines = list(self.pipes[rank].last_lines)
        self.exited.append(outcome)
        self.sink.rank_finished(outcome)
