"""The policy of a one-shot launch: collect every rank's result, and stop the rest on a failure.

When a rank fails the others are stopped at once (SIGTERM, then SIGKILL): a peer blocked in a
collective would otherwise wait for the process group's timeout. On an interrupt, SIGINT first
so Python code can unwind; on a timeout, like a failure. Only the ranks' own process groups are
ever signalled.

Example::

    outcomes = Supervisor(processes, pipes, sink, deadline=None).run()
"""

from __future__ import annotations

import os
import signal

from nbaccel.wire import frames as channel
from nbaccel.errors import LaunchTimeoutError
from nbaccel.launch.outcome import RankOutcome, RemoteError, Status, undecodable_result
from nbaccel.launch.pipes import RankPipes
from nbaccel.output.sinks import Sink
from nbaccel.launch.processes import RankProcess
from nbaccel.launch.loop import RankWatch

# (delay from the start of a stop, signal): how each kind of stop escalates.
STOP_PLANS = {
    Status.STOPPED: [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
    Status.TIMED_OUT: [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
    Status.INTERRUPTED: [(0.0, signal.SIGINT), (2.0, signal.SIGTERM), (3.5, signal.SIGKILL)],
}


_LINGER = 3.0  # seconds a rank that reported its error may take to exit by itself


class Supervisor(RankWatch):
    """Runs one attempt until every rank has ended and been reaped; returns their outcomes."""

    def __init__(self, processes: list[RankProcess], pipes: list[RankPipes], sink: Sink, deadline: float | None, timeout: float | None = None) -> None:
        super().__init__(processes, pipes, sink)
        self.deadline = deadline
        self.timeout = timeout
        self.outcomes = [RankOutcome(rank=p.rank) for p in processes]
        self._stop_reason: Status | None = None
        self._running_at_timeout: dict[int, str] = {}

    def run(self) -> list[RankOutcome]:
        try:
            try:
                self.loop()
            except KeyboardInterrupt:
                self._stop(Status.INTERRUPTED)
                self._finish_after_interrupt()
                raise
        finally:
            self.close()
        if self._stop_reason is Status.TIMED_OUT:
            raise LaunchTimeoutError(self.timeout or 0.0, self._running_at_timeout, self.outcomes)
        return self.outcomes

    def done(self) -> bool:
        return all(p.returncode is not None for p in self.processes)

    def next_deadline(self) -> float | None:
        return self.deadline if self._stop_reason is None else None

    def on_clock(self, now: float) -> None:
        if self.deadline is not None and self._stop_reason is None and now >= self.deadline:
            self._running_at_timeout = {
                o.rank: (self.pipes[o.rank].last_lines[-1] if self.pipes[o.rank].last_lines else "")
                for o in self.outcomes
                if o.status is Status.RUNNING
            }
            self._stop(Status.TIMED_OUT)

    def on_frame(self, rank: int, kind: channel.Kind, payload: bytes) -> None:
        outcome = self.outcomes[rank]
        if kind is channel.Kind.RESULT:
            try:
                outcome.value = channel.loads(payload)
            except Exception as exc:  # noqa: BLE001 - any unpickling failure is that rank's
                outcome.error = undecodable_result(rank, exc)
                outcome.status = Status.FAILED
                self._stop(Status.STOPPED)
                return
            outcome.status = Status.SUCCEEDED
            if all(o.status is Status.SUCCEEDED for o in self.outcomes):
                self._release()
        elif kind is channel.Kind.ERROR:
            outcome.error = RemoteError.from_fields(channel.loads(payload))
            if not self._echoes_our_stop(outcome.error):
                outcome.status = Status.FAILED
                self._stop(Status.STOPPED, spare=rank)
        else:
            super().on_frame(rank, kind, payload)

    def _release(self) -> None:
        """Every rank returned: let the ones waiting to leave their process group go."""
        for pipes in self.pipes:
            if pipes.commands is None:
                continue
            try:
                os.write(pipes.commands, b"\0")
            except OSError:  # the rank had no process group and is already gone
                pass

    def _echoes_our_stop(self, error: RemoteError) -> bool:
        """A peer's closed connection or our own SIGINT, raised after we began stopping."""
        return self._stop_reason is not None and (error.is_peer_error or error.type_name == "KeyboardInterrupt")

    def on_exit(self, rank: int) -> None:
        """Decide how a reaped rank ended, from its exit status and what it reported."""
        proc, outcome = self.processes[rank], self.outcomes[rank]
        outcome.last_lines = list(self.pipes[rank].last_lines)
        code = proc.returncode
        assert code is not None
        outcome.exitcode = code if code >= 0 else None
        outcome.signal = -code if code < 0 else None
        if outcome.status is Status.SUCCEEDED and code != 0 and not proc.signals_sent:
            outcome.status = Status.EXITED  # returned, then died in teardown: the value is suspect
        if outcome.status is Status.RUNNING:
            outcome.status = self._status_of_silent_end(proc, outcome, code)
        self.sink.rank_finished(outcome)
        if outcome.is_failure:
            self._stop(Status.STOPPED)

    def _status_of_silent_end(self, proc: RankProcess, outcome: RankOutcome, code: int) -> Status:
        """A rank that ended without a result or an error of its own."""
        if self._stop_reason is not None and (proc.signals_sent or outcome.error is not None):
            return self._stop_reason  # our stop ended it (its error, if any, only echoed the stop)
        return Status.SIGNALED if code < 0 else Status.EXITED

    def _stop(self, reason: Status, spare: int | None = None) -> None:
        """Begin stopping every live rank; an interrupt overrides any other stop under way.

        ``spare`` is a rank that reported its own error and is exiting by itself: signalling it
        would race its exit and lose its exit code; it is only killed if it lingers.
        """
        if self._stop_reason is Status.INTERRUPTED or (self._stop_reason is not None and reason is not Status.INTERRUPTED):
            return
        self._stop_reason = reason
        others = [p for p in self.processes if p.rank != spare]
        self.escalate(STOP_PLANS[reason], others)
        if spare is not None:
            self.escalate([(_LINGER, signal.SIGKILL)], [self.processes[spare]], keep=True)

    def _finish_after_interrupt(self) -> None:
        """Reap every rank after an interrupt; a second interrupt skips straight to SIGKILL."""
        try:
            self.loop()
        except KeyboardInterrupt:
            self.signal(signal.SIGKILL)
            for proc in self.processes:
                proc.wait(timeout=5.0)
