"""The policy of a one-shot launch: collect every rank's result, and stop the rest on a failure.

When a rank fails the others are stopped at once (SIGTERM, then SIGKILL): a peer blocked in a
collective would otherwise wait for the process group's timeout. On an interrupt, SIGINT first
so Python code can unwind; on a timeout, like a failure. Only the ranks (and the POSIX process
groups each leads, its DataLoader workers) are ever signalled. ``run_attempt`` runs one attempt of a launch through any ``GroupStarter``;
``run_launch`` is the restart strategy over attempts.

Example::

    values = run_launch(LocalGroupStarter(ForkStarter()), job, plan, sink=TextSink())
"""

from __future__ import annotations

import signal
import time
from typing import Any

from nbaccel.errors import LaunchTimeoutError, RankFailedError
from nbaccel.launch.escalation import LINGER, STOP_PLANS
from nbaccel.launch.loop import EventLoop, Policy, SinkSession
from nbaccel.launch.notices import say
from nbaccel.launch.outcome import RankOutcome, Status, root_cause, where_ranks_were
from nbaccel.launch.seam import GroupStarter, LaunchPlan, Sink
from nbaccel.wire import events
from nbaccel.wire.job import Job

_STOP_WHY = {
    Status.STOPPED: "stopped because another rank failed",
    Status.TIMED_OUT: "stopped at the timeout",
    Status.INTERRUPTED: "interrupted",
}

# Seconds every rank may take, once all returned, to leave its process group and exit. Gloo and a
# healthy NCCL take well under a second; a stuck NCCL teardown would wait for its watchdog (10 min).
TEARDOWN_BOUND = 10.0


def run_launch(group_starter: GroupStarter, job: Job, plan: LaunchPlan, sink: Sink) -> list[Any]:
    """Every rank's value, by rank; after a failure, relaunch every rank up to ``plan.max_restarts`` times.

    Each attempt is a fresh group with a fresh rendezvous: a restart never meets a stale store.
    """
    failed_attempts: list[list[RankOutcome]] = []
    for attempt in range(plan.max_restarts + 1):
        outcomes = run_attempt(group_starter, job, plan, attempt, sink)
        if all(o.status is Status.SUCCEEDED for o in outcomes):
            return [o.value for o in outcomes]
        failed_attempts.append(outcomes)
        if attempt < plan.max_restarts:
            root = root_cause(outcomes)
            summary = root.describe() if root else "a rank did not return"
            say(f"attempt {attempt + 1} of {plan.max_restarts + 1} failed ({summary}); restarting all {plan.num_processes} ranks")
    error = RankFailedError(root_cause(failed_attempts[-1]) or failed_attempts[-1][0], failed_attempts[-1])
    error.attempts = failed_attempts
    raise error


def run_attempt(group_starter: GroupStarter, job: Job, plan: LaunchPlan, attempt: int, sink: Sink) -> list[RankOutcome]:
    """Start every rank, relay their output to ``sink``, and return their outcomes, by rank.

    Returns when every rank has ended and been reaped. Raises KeyboardInterrupt (after stopping
    every rank) if interrupted, and LaunchTimeoutError when ``plan.deadline`` passes.
    """
    with SinkSession(sink, plan.num_processes, attempt) as session:
        group = group_starter.start_group(job, plan, attempt, persistent=False)
        policy = OneShot()
        try:
            loop = session.watch(EventLoop(group, sink, policy, deadline=plan.deadline, timeout=plan.timeout, stall_report=plan.stall_report))
            loop.run()
        finally:
            group.close()
    if policy.killed_in_teardown:
        ranks = ", ".join(map(str, policy.killed_in_teardown))
        say(
            f"rank(s) {ranks} returned but did not leave the process group within {TEARDOWN_BOUND:g} s (stuck in destroy_process_group); nbaccel killed them, and their results are kept"
        )
    if loop.interrupted:
        raise KeyboardInterrupt(where_ranks_were(loop.outcome_list()))
    if loop.timed_out:
        raise LaunchTimeoutError(plan.timeout or 0.0, loop.running_at_timeout, loop.outcome_list())
    return loop.outcome_list()


class OneShot(Policy):
    """Every rank runs the job once and exits; the first real failure stops the others."""

    abandons_on_interrupt = False

    def __init__(self) -> None:
        self._teardown_ends: float | None = None  # once every rank returned: when leaving must be over
        self.killed_in_teardown: list[int] = []  # ranks killed because their teardown hung

    def done(self, loop: EventLoop) -> bool:
        return loop.ended.issuperset(loop.ranks)

    def on_answer(self, loop: EventLoop, outcome: RankOutcome, raised: bool) -> None:
        if outcome.status is Status.SUCCEEDED:
            if all(o.status is Status.SUCCEEDED for o in loop.outcomes.values()):
                loop.group.release()  # let ranks waiting to leave their process group go
                self._teardown_ends = time.monotonic() + TEARDOWN_BOUND
        elif outcome.status is Status.FAILED:
            # A rank that reported its own error is exiting by itself: signalling it would race
            # its exit and lose its exit code; it is only killed if it lingers.
            self._stop(loop, Status.STOPPED, spare=outcome.rank if raised else None)

    def on_exit(self, loop: EventLoop, outcome: RankOutcome) -> None:
        loop.finish(outcome)
        if outcome.is_failure:
            self._stop(loop, Status.STOPPED)

    def on_timeout(self, loop: EventLoop) -> None:
        self._stop(loop, Status.TIMED_OUT)

    def on_interrupt(self, loop: EventLoop) -> None:
        self._stop(loop, Status.INTERRUPTED)

    def on_second_interrupt(self, loop: EventLoop) -> None:
        loop.group.signal(signal.SIGKILL, loop.ranks)  # the group's close() reaps them
        for outcome in loop.outcome_list():
            if outcome.status is Status.RUNNING:  # killed by us before it ended: interrupted, not "running"
                outcome.status, outcome.signal = Status.INTERRUPTED, signal.SIGKILL
                outcome.last_lines = list(loop.group.last_lines(outcome.rank))
                loop.finish(outcome)

    def wake_at(self) -> float | None:
        return self._teardown_ends

    def on_clock(self, loop: EventLoop, now: float) -> None:
        """Kill the ranks still leaving their process group when the teardown bound passes."""
        if self._teardown_ends is None or now < self._teardown_ends:
            return
        self._teardown_ends = None
        self.killed_in_teardown = [rank for rank in loop.ranks if rank not in loop.ended]
        if self.killed_in_teardown:
            loop.group.signal(signal.SIGKILL, self.killed_in_teardown)  # the group reaps them

    def _stop(self, loop: EventLoop, reason: Status, spare: int | None = None) -> None:
        if not loop.begin_stop(reason):
            if spare is not None:
                _let_go(loop, spare)
            return
        # Before any signal: where each rank still running is (after SIGINT its stack unwinds).
        # A rank that raised waits for this (rank.bootstrap holds it), so a peer blocked in a
        # collective is still there to answer, not dead of the failing rank's closed connection.
        loop.collect_stacks([rank for rank in loop.running() if rank != spare], _STOP_WHY[reason])
        if spare is not None:
            _let_go(loop, spare)
        loop.escalate(STOP_PLANS[reason.value], [rank for rank in loop.ranks if rank != spare])
        if spare is not None:
            loop.escalate([(LINGER, signal.SIGKILL)], [spare], keep=True)


def _let_go(loop: EventLoop, rank: int) -> None:
    """Tell a rank held at its error that its peers' stacks are taken: it may exit."""
    try:
        loop.group.send(rank, events.Kind.ANSWER, events.dumps(None))
    except OSError:  # it exited already
        pass
