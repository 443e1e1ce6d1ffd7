"""Worker calls whose code is the rank's own: the kernel sends a name, the rank runs its function.

A persistent worker runs callables over its namespace (``nbaccel.pool.worker_calls``). A few of
them read what only the rank's own modules hold (its last failure for the debugger, its count of
collectives): the kernel must not import those rank modules to build them, so it sends one of
these names instead, and the worker's loop (``nbaccel.rank.serve``) runs the function it stands
for. A member pickles by reference, as ``Job`` does, and means the same on both sides.

Example:
    >>> RankCall.COLLECTIVE_COUNT.value
    'collective_count'
"""

from __future__ import annotations

import enum


class RankCall(enum.Enum):
    """A worker call the rank answers with its own code (see ``nbaccel.rank.serve``)."""

    DEBUG_LAST_FAILURE = "debug_last_failure"  # the post-mortem of the rank's last failed cell: False without one
    COLLECTIVE_COUNT = "collective_count"  # the default group's count of collectives (None: no group)
