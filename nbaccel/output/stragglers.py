"""A rank that took far longer than the others, in one line: every launch's summary says it.

Without ``--profile`` the kernel still knows when each rank finished; a rank that took 1.5x the
median and over a second more is named (``--profile`` then says why: ``profile_summary``).

Example:
    >>> wall_straggler({0: 1.0, 1: 1.1, 2: 4.0})
    'rank 2 took 4.0 s, 3.6x the median of 1.1 s'
    >>> wall_straggler({0: 1.0, 1: 1.4}) is None
    True
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping

RATIO = 1.5  # a rank slower than 1.5x the median ...
MIN_SECONDS = 1.0  # ... and by over a second (a short cell's jitter is no straggler)


def wall_straggler(elapsed: Mapping[int, float]) -> str | None:
    """One line naming the slowest rank of ``elapsed`` (rank -> seconds) when it is far behind."""
    if len(elapsed) < 2:
        return None
    median = statistics.median(elapsed.values())
    rank = max(elapsed, key=lambda r: elapsed[r])
    slowest = elapsed[rank]
    if slowest < RATIO * median or slowest - median <= MIN_SECONDS:
        return None
    return f"rank {rank} took {slowest:.1f} s, {slowest / median:.1f}x the median of {median:.1f} s"
