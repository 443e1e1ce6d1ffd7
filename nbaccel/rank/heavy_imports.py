"""Rank side of warming: which allow-listed heavy modules a rank had to import itself.

The rank reports them (``Kind.IMPORTED``) and the kernel imports them after the launch, so later
forks inherit them (``nbaccel.launch.warm``).

Example:
    >>> imported_by_rank(present()) == set()
    True
"""

from __future__ import annotations

import sys

from nbaccel.wire.events import WARM_MODULES


def present() -> set[str]:
    """The allow-listed modules this process has now (a rank records them when it starts)."""
    return {name for name in WARM_MODULES if name in sys.modules}


_BY_NBACCEL: set[str] = set()  # imported by nbaccel's own tools in the rank (the profiler: torch._dynamo), not by the user's code


def imported_by_nbaccel(names: set[str]) -> None:
    """``names`` were imported by nbaccel in this rank: warming them would cost every later launch
    the import (an agent misses its heartbeats meanwhile) for no user's code."""
    _BY_NBACCEL.update(names)


def imported_by_rank(at_start: set[str]) -> set[str]:
    """Allow-listed modules a rank imported since it started (not those nbaccel's tools imported)."""
    return present() - at_start - _BY_NBACCEL
