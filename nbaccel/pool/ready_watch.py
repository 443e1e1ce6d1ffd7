"""The start-up handshake of persistent workers: every rank says READY once it joined the group."""

from __future__ import annotations

import time

from nbaccel.wire import frames as channel
from nbaccel.errors import LaunchTimeoutError, RankFailedError
from nbaccel.launch.outcome import RankOutcome, RemoteError, Status, root_cause
from nbaccel.launch.pipes import RankPipes
from nbaccel.output.sinks import Sink
from nbaccel.launch.processes import RankProcess
from nbaccel.launch.loop import RankWatch


class _ReadyWatch(RankWatch):
    def __init__(self, processes: list[RankProcess], pipes: list[RankPipes], sink: Sink, deadline: float) -> None:
        super().__init__(processes, pipes, sink)
        self.deadline = deadline
        self.devices: dict[int, str] = {}
        self.outcomes = [RankOutcome(p.rank) for p in processes]
        self.timed_out = False

    def done(self) -> bool:
        return self.timed_out or len(self.devices) == len(self.processes) or any(o.is_failure for o in self.outcomes)

    def next_deadline(self) -> float | None:
        return self.deadline

    def on_clock(self, now: float) -> None:
        self.timed_out = now >= self.deadline and len(self.devices) < len(self.processes)

    def on_frame(self, rank: int, kind: channel.Kind, payload: bytes) -> None:
        if kind is channel.Kind.READY:
            self.devices[rank] = channel.loads(payload)["device"]
        elif kind is channel.Kind.ERROR:
            self.outcomes[rank].error = RemoteError.from_fields(channel.loads(payload))
            self.outcomes[rank].status = Status.FAILED
        else:
            super().on_frame(rank, kind, payload)

    def on_exit(self, rank: int) -> None:
        outcome, code = self.outcomes[rank], self.processes[rank].returncode
        assert code is not None
        outcome.last_lines = list(self.pipes[rank].last_lines)
        if outcome.status is Status.RUNNING:
            outcome.status = Status.SIGNALED if code < 0 else Status.EXITED
            outcome.exitcode, outcome.signal = (code, None) if code >= 0 else (None, -code)


def wait_until_ready(processes: list[RankProcess], pipes: list[RankPipes], sink: Sink, deadline: float) -> list[str]:
    """Every rank's device once all are ready; raises if a rank fails or the deadline passes."""
    watch = _ReadyWatch(processes, pipes, sink, deadline)
    try:
        watch.loop()
    finally:
        watch.close()
    root = root_cause(watch.outcomes)
    if root is not None:
        raise RankFailedError(root, watch.outcomes)
    if watch.timed_out:
        waiting = {o.rank: (pipes[o.rank].last_lines[-1] if pipes[o.rank].last_lines else "") for o in watch.outcomes if o.rank not in watch.devices}
        raise LaunchTimeoutError(max(0.0, deadline - time.monotonic()), waiting, watch.outcomes)
    return [watch.devices[p.rank] for p in processes]
