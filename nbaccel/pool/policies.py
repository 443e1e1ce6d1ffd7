"""The policies of a pool's loop: its start, each task, its end (over ``nbaccel.launch.loop``).

``Ready`` is the start-up handshake: every rank says READY once it joined the group, inside the one
sink lifecycle (``SinkSession``: the sink hears ``launch_started`` before any start-up output and
``launch_finished`` once the wait ends, however it ends; a text sink flushes there).

``Task`` is one task on the workers: wait for the chosen ranks' answers and keep the pool. Unlike a
one-shot launch, a failing or interrupted task must leave the workers alive: the other busy ranks
get SIGINT (Python code and sleeps unwind with KeyboardInterrupt and report it), and only ranks that
do not answer within INTERRUPT_GRACE seconds (stuck in a collective or native code) make the pool
unusable. A rank that exits is a broken pool at once.

``UntilEnded`` is the workers leaving: the loop wakes on each rank's exit (a pidfd on one node, a
message from a node agent), so a stop costs the time the ranks take and nothing more: no polling.

Example::

    devices = wait_until_ready(group, sink, start_timeout=120.0)
    EventLoop(group, sink, Task(), ranks=[0, 1], deadline=None).run()
    for rank in range(group.num_processes):
        group.send(rank, Kind.STOP, b"")
    wait_until_ended(group, grace=2.0)
    group.close()  # SIGKILLs whatever is left
"""

from __future__ import annotations

import signal
import time
from typing import NoReturn

from nbaccel.errors import LaunchTimeoutError, RankFailedError
from nbaccel.launch.loop import EventLoop, Policy, SinkSession
from nbaccel.launch.outcome import RankOutcome, Status, root_cause
from nbaccel.launch.seam import RankGroup, Sink
from nbaccel.output.sinks import CollectingSink

# -- starting: every rank READY -------------------------------------------------------------------


class Ready(Policy):
    """Done when every rank is ready, one has failed, or the start timeout passed."""

    def __init__(self) -> None:
        self.devices: dict[int, str] = {}

    def done(self, loop: EventLoop) -> bool:
        return loop.timed_out or len(self.devices) == len(loop.ranks) or any(o.is_failure for o in loop.outcomes.values())

    def on_ready(self, loop: EventLoop, rank: int, info: dict[str, object]) -> None:
        self.devices[rank] = str(info["device"])


def wait_until_ready(group: RankGroup, sink: Sink, start_timeout: float) -> list[str]:
    """Every rank's device once all are ready; raises if a rank fails or ``start_timeout`` passes."""
    policy = Ready()
    with SinkSession(sink, group.num_processes, 0) as session:
        loop = session.watch(EventLoop(group, sink, policy, deadline=time.monotonic() + start_timeout))
        loop.run()
    root = root_cause(loop.outcome_list())
    if root is not None:
        raise RankFailedError(root, loop.outcome_list())
    if loop.timed_out:
        waiting = {rank: line for rank, line in loop.running_at_timeout.items() if rank not in policy.devices}
        raise LaunchTimeoutError(start_timeout, waiting, _waiting_outcomes(loop, policy), what="the workers' start", option="start_timeout")
    return [policy.devices[rank] for rank in loop.ranks]


def _waiting_outcomes(loop: EventLoop, policy: Ready) -> list[RankOutcome]:
    return [o for o in loop.outcome_list() if o.rank not in policy.devices]


# -- one task --------------------------------------------------------------------------------------

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


# -- leaving: every rank ended ---------------------------------------------------------------------


class UntilEnded(Policy):
    """Done when every rank has ended, or the deadline (the grace) passed."""

    def done(self, loop: EventLoop) -> bool:
        return loop.timed_out or loop.ended.issuperset(loop.ranks)


def wait_until_ended(group: RankGroup, grace: float) -> None:
    """Return once every rank of ``group`` ended, or after ``grace`` seconds; what they print is dropped."""
    EventLoop(group, CollectingSink(), UntilEnded(), deadline=time.monotonic() + grace).run()
