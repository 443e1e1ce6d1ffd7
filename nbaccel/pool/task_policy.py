"""The policy of one task on persistent workers: wait for the chosen ranks' answers, keep the pool.

Unlike a one-shot launch, a failing or interrupted task must leave the workers alive: the other
busy ranks get SIGINT (Python code and sleeps unwind with KeyboardInterrupt and report it), and
only ranks that do not answer within INTERRUPT_GRACE seconds (stuck in a collective or native
code) make the pool unusable. A rank that exits is a broken pool at once.

Example::

    policy = Task()
    EventLoop(group, sink, policy, ranks=[0, 1], deadline=None).run()
"""

from __future__ import annotations

import signal
import time
from typing import NoReturn

from nbaccel.errors import LaunchTimeoutError, RankFailedError
from nbaccel.launch.loop import EventLoop, Policy
from nbaccel.launch.outcome import RankOutcome, Status, root_cause

INTERRUPT_GRACE = 10.0

_WHY = {
    Status.STOPPED: "interrupted because another rank failed",
    Status.TIMED_OUT: "interrupted at the timeout",
    Status.INTERRUPTED: "interrupted",
}


class Task(Policy):
    """Collects one task's answer from each rank taking part; knows when the pool broke."""

    abandons_on_interrupt = False

    def __init__(self, grace: float | None = None) -> None:
        self.grace = INTERRUPT_GRACE if grace is None else grace
        self.exited: list[RankOutcome] = []  # ranks whose process ended: the pool is broken
        self._grace_ends: float | None = None

    def stuck(self, loop: EventLoop) -> list[int]:
        """Ranks that did not answer within the grace after SIGINT."""
        if self._grace_ends is None or time.monotonic() < self._grace_ends:
            return []
        return loop.running()

    def done(self, loop: EventLoop) -> bool:
        return bool(self.exited or self.stuck(loop) or not loop.running())

    def on_answer(self, loop: EventLoop, outcome: RankOutcome, raised: bool) -> None:
        loop.finish(outcome)
        if outcome.status is Status.FAILED and raised:
            self._interrupt(loop, Status.STOPPED)  # peers may wait for it in a collective

    def on_exit(self, loop: EventLoop, outcome: RankOutcome) -> None:
        outcome.status = Status.SIGNALED if outcome.signal is not None else Status.EXITED  # ended mid-task: a crash
        self.exited.append(outcome)
        loop.finish(outcome)

    def on_timeout(self, loop: EventLoop) -> None:
        self._interrupt(loop, Status.TIMED_OUT)

    def on_interrupt(self, loop: EventLoop) -> None:
        self._interrupt(loop, Status.INTERRUPTED)

    def on_second_interrupt(self, loop: EventLoop) -> None:
        self.exited.append(RankOutcome(-1, Status.INTERRUPTED))  # give up on the workers

    def wake_at(self) -> float | None:
        return self._grace_ends

    def _interrupt(self, loop: EventLoop, reason: Status) -> None:
        """SIGINT every rank still busy with the task; they have ``grace`` seconds to answer."""
        loop.begin_stop(reason)
        if self._grace_ends is None:
            loop.collect_stacks(loop.running(), _WHY[reason])
            self._grace_ends = time.monotonic() + self.grace
            loop.escalate([(0.0, signal.SIGINT)], loop.running(), keep=True)


def raise_stuck_error(loop: EventLoop, reason: str, timeout: float | None) -> NoReturn:
    """The error of a task whose ranks would not stop (the workers were stopped): what started
    the stop, so a peer's failure reads as that failure and a timeout as a timeout, never as an
    interrupt nobody pressed. ``reason`` says which ranks did not stop."""
    outcomes = loop.outcome_list()
    root = root_cause(outcomes)
    if loop.stop_reason in (Status.STOPPED, Status.TIMED_OUT) and root is not None:
        raise RankFailedError(root, outcomes)
    if loop.stop_reason is Status.TIMED_OUT:
        raise LaunchTimeoutError(timeout or 0.0, loop.running_at_timeout, outcomes, what="the cell on the workers")
    raise KeyboardInterrupt(f"{reason}; the workers were stopped")
