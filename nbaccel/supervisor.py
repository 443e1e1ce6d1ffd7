"""Watch one attempt's ranks from the kernel: relay output, collect results, stop ranks when needed.

One loop, in the thread that launched (the cell's), waits on every rank's pipes and pidfd at once:
no polling sleeps, no threads. Rank 0's events are handled first whenever several are ready.
When a rank fails, the others are stopped at once (SIGTERM, then SIGKILL); on an interrupt, SIGINT
first so Python code can unwind; on a timeout, like a failure. Only the ranks' own process groups
are ever signalled.

Example::

    supervisor = Supervisor(processes, pipes, sink, deadline=None)
    outcomes = supervisor.run()
"""

from __future__ import annotations

import selectors
import signal
import time
from collections.abc import Callable

from . import channel
from .errors import LaunchTimeoutError
from .outcome import RankOutcome, RemoteError, Status
from .output.relay import RankPipes
from .output.sinks import Sink
from .process import RankProcess

# (delay from the start of a stop, signal): how each kind of stop escalates.
_STOP_PLANS = {
    Status.STOPPED: [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
    Status.TIMED_OUT: [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
    Status.INTERRUPTED: [(0.0, signal.SIGINT), (2.0, signal.SIGTERM), (3.5, signal.SIGKILL)],
}
_NO_PIDFD_POLL = 0.02  # only where the OS has no pidfd: how often exits are looked for


class Supervisor:
    """Runs the event loop of one attempt until every rank has ended and been reaped."""

    def __init__(self, processes: list[RankProcess], pipes: list[RankPipes], sink: Sink, deadline: float | None, timeout: float | None = None) -> None:
        self.processes = processes
        self.pipes = pipes
        self.sink = sink
        self.deadline = deadline
        self.timeout = timeout
        self.outcomes = [RankOutcome(rank=p.rank) for p in processes]
        self._stop_reason: Status | None = None
        self._stop_plan: list[tuple[float, int]] = []
        self._running_at_timeout: dict[int, str] = {}
        self._selector = selectors.DefaultSelector()

    def run(self) -> list[RankOutcome]:
        try:
            self._register()
            try:
                self._loop()
            except KeyboardInterrupt:
                self._stop(Status.INTERRUPTED)
                self._finish_after_interrupt()
                raise
        finally:
            self._selector.close()
        if self._stop_reason is Status.TIMED_OUT:
            raise LaunchTimeoutError(self.timeout or 0.0, self._running_at_timeout, self.outcomes)
        return self.outcomes

    # -- the loop ---------------------------------------------------------------------------

    def _register(self) -> None:
        for proc, pipes in zip(self.processes, self.pipes):
            handlers: list[tuple[int, int, Callable[[int], None]]] = [
                (pipes.channel, 0, self._on_channel),
                (pipes.stdout, 1, self._on_stdout),
                (pipes.stderr, 2, self._on_stderr),
            ]
            if proc.pidfd is not None:
                handlers.append((proc.pidfd, 3, self._on_exit))
            for fd, order, handler in handlers:
                self._selector.register(fd, selectors.EVENT_READ, ((proc.rank, order), handler))

    def _loop(self) -> None:
        while any(p.returncode is None for p in self.processes):
            events = self._selector.select(self._wait_time())
            for key, _ in sorted(events, key=lambda e: e[0].data[0]):
                rank, _order = key.data[0]
                if key.fd in self._selector.get_map():  # an earlier handler may have dropped it
                    key.data[1](rank)
            self._poll_exits_without_pidfd()
            self._check_clocks()

    def _wait_time(self) -> float | None:
        moments = [t for t, _ in self._stop_plan[:1]]
        if self.deadline is not None and self._stop_reason is None:
            moments.append(self.deadline)
        wait = max(0.0, min(moments) - time.monotonic()) if moments else None
        if any(p.pidfd is None for p in self.processes):
            wait = _NO_PIDFD_POLL if wait is None else min(wait, _NO_PIDFD_POLL)
        return wait

    def _check_clocks(self) -> None:
        now = time.monotonic()
        if self.deadline is not None and self._stop_reason is None and now >= self.deadline:
            self._running_at_timeout = {
                o.rank: (self.pipes[o.rank].last_lines[-1] if self.pipes[o.rank].last_lines else "")
                for o in self.outcomes
                if o.status is Status.RUNNING
            }
            self._stop(Status.TIMED_OUT)
        while self._stop_plan and self._stop_plan[0][0] <= now:
            _, sig = self._stop_plan.pop(0)
            self._signal_live(sig)

    # -- handlers -----------------------------------------------------------------------------

    def _on_stdout(self, rank: int) -> None:
        self._read_stream(rank, "stdout")

    def _on_stderr(self, rank: int) -> None:
        self._read_stream(rank, "stderr")

    def _read_stream(self, rank: int, stream: str) -> None:
        pipes = self.pipes[rank]
        fd = pipes.stdout if stream == "stdout" else pipes.stderr
        if not pipes.read_stream(fd, stream, self.sink):
            self._selector.unregister(fd)

    def _on_channel(self, rank: int) -> None:
        frames, open_ = self.pipes[rank].read_channel()
        if not open_:
            self._selector.unregister(self.pipes[rank].channel)
        self._handle_frames(rank, frames)

    def _on_exit(self, rank: int) -> None:
        proc = self.processes[rank]
        if proc.poll() is None:
            return
        pipes = self.pipes[rank]
        for fd in (*pipes.fds, proc.pidfd):
            if fd is not None and fd in self._selector.get_map():
                self._selector.unregister(fd)
        self._handle_frames(rank, pipes.drain(self.sink))
        self._settle(rank)

    def _poll_exits_without_pidfd(self) -> None:
        for proc in self.processes:
            if proc.pidfd is None and proc.returncode is None and proc.poll() is not None:
                self._on_exit(proc.rank)

    def _handle_frames(self, rank: int, frames: list[tuple[channel.Kind, bytes]]) -> None:
        outcome = self.outcomes[rank]
        for kind, payload in frames:
            if kind is channel.Kind.RESULT:
                outcome.value = channel.loads(payload)
                outcome.status = Status.SUCCEEDED
            elif kind is channel.Kind.ERROR:
                outcome.error = RemoteError(**channel.loads(payload))
                self._on_rank_error(outcome)
            elif kind is channel.Kind.EVENT:
                self.sink.event(rank, channel.loads(payload))

    def _on_rank_error(self, outcome: RankOutcome) -> None:
        assert outcome.error is not None
        stopped_by_us = self._stop_reason is not None
        if stopped_by_us and (outcome.error.is_peer_error or outcome.error.type_name == "KeyboardInterrupt"):
            return  # a consequence of our own stop, not a cause
        outcome.status = Status.FAILED
        self._stop(Status.STOPPED)

    # -- ending ranks ---------------------------------------------------------------------------

    def _settle(self, rank: int) -> None:
        """Decide how a reaped rank ended, from its exit status and what it reported."""
        proc, outcome = self.processes[rank], self.outcomes[rank]
        outcome.last_lines = list(self.pipes[rank].last_lines)
        code = proc.returncode
        assert code is not None
        outcome.exitcode = code if code >= 0 else None
        outcome.signal = -code if code < 0 else None
        if outcome.status is Status.SUCCEEDED and code != 0:
            outcome.status = Status.EXITED  # returned, then died in teardown: the value is suspect
        if outcome.status is Status.RUNNING:
            if proc.signals_sent and self._stop_reason is not None:
                outcome.status = self._stop_reason
            elif outcome.error is not None and self._stop_reason is not None:
                outcome.status = self._stop_reason  # its error only echoed our stop
            elif code < 0:
                outcome.status = Status.SIGNALED
            else:
                outcome.status = Status.EXITED
        self.sink.rank_finished(outcome)
        if outcome.is_failure:
            self._stop(Status.STOPPED)

    def _stop(self, reason: Status) -> None:
        """Begin stopping every live rank (once); escalation follows _STOP_PLANS."""
        if self._stop_reason is not None and reason is not Status.INTERRUPTED:
            return
        if self._stop_reason is Status.INTERRUPTED:
            return
        self._stop_reason = reason
        start = time.monotonic()
        plan = [(start + delay, sig) for delay, sig in _STOP_PLANS[reason]]
        self._signal_live(plan.pop(0)[1])
        self._stop_plan = plan

    def _signal_live(self, sig: int) -> None:
        for proc in self.processes:
            if proc.returncode is None:
                proc.send(sig)

    def _finish_after_interrupt(self) -> None:
        """Reap every rank after an interrupt; a second interrupt skips straight to SIGKILL."""
        try:
            self._loop()
        except KeyboardInterrupt:
            self._signal_live(signal.SIGKILL)
            for proc in self.processes:
                proc.wait(timeout=5.0)
