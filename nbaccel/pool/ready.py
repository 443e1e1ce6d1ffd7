"""The start-up handshake of persistent workers: every rank says READY once it joined the group.

A small policy over the one event loop (``nbaccel.launch.loop``), inside the one sink lifecycle
(``SinkSession``): the sink hears ``launch_started`` before any start-up output and
``launch_finished`` once the wait ends, however it ends (a text sink flushes there).

Example::

    devices = wait_until_ready(group, sink, start_timeout=120.0)
"""

from __future__ import annotations

import time

from nbaccel.errors import LaunchTimeoutError, RankFailedError
from nbaccel.launch.loop import EventLoop, Policy, SinkSession
from nbaccel.launch.outcome import RankOutcome, root_cause
from nbaccel.launch.seam import RankGroup, Sink


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
