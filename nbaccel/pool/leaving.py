"""Workers leaving: wait, on the one event loop, until every rank has ended or the grace is over.

The loop wakes on each rank's exit (a pidfd on one node, a message from a node agent), so a
stop costs the time the ranks take and nothing more: no polling.

Example::

    for rank in range(group.num_processes):
        group.send(rank, Kind.STOP, b"")
    wait_until_ended(group, grace=2.0)
    group.close()  # SIGKILLs whatever is left
"""

from __future__ import annotations

import time

from nbaccel.launch.loop import EventLoop, Policy
from nbaccel.launch.seam import RankGroup
from nbaccel.output.sinks import CollectingSink


class UntilEnded(Policy):
    """Done when every rank has ended, or the deadline (the grace) passed."""

    def done(self, loop: EventLoop) -> bool:
        return loop.timed_out or loop.ended.issuperset(loop.ranks)


def wait_until_ended(group: RankGroup, grace: float) -> None:
    """Return once every rank of ``group`` ended, or after ``grace`` seconds; what they print is dropped."""
    EventLoop(group, CollectingSink(), UntilEnded(), deadline=time.monotonic() + grace).run()
