"""Rank side of warming: which allow-listed heavy modules a rank had to import itself.

The rank reports them (``Kind.IMPORTED``) and the kernel imports them after the launch, so later
forks inherit them (``nbaccel.launch.warm``).

Example:
    >>> imported_by_rank(present()) == set()
    True
"""

from __future__ import annotations

import os
import sys

from nbaccel.wire.events import WARM_MODULES


def present() -> set[str]:
    """The allow-listed modules this process has now (a rank records them when it starts)."""
    return {name for name in WARM_MODULES if name in sys.modules}


def present_at_start() -> set[str]:
    """The allow-listed modules this process had when it started: for a forked rank, its parent's
    at the fork (noted there, before each fork: the rank then makes no set, ~8 copied pages).

    Example:
        >>> present_at_start() >= set() and isinstance(present_at_start(), set)
        True
    """
    return _AT_FORK if _AT_FORK is not None else present()


def _note_at_fork() -> None:
    global _AT_FORK
    _AT_FORK = present()


_AT_FORK: set[str] | None = None  # set in the forking process right before each fork (None: spawned, not forked)

_BY_NBACCEL: set[str] = set()  # imported by nbaccel's own tools in the rank (the profiler: torch._dynamo), not by the user's code


def imported_by_nbaccel(names: set[str]) -> None:
    """``names`` were imported by nbaccel in this rank: warming them would cost every later launch
    the import (an agent misses its heartbeats meanwhile) for no user's code."""
    _BY_NBACCEL.update(names)


def imported_by_rank(at_start: set[str]) -> set[str]:
    """Allow-listed modules a rank imported since it started (not those nbaccel's tools imported)."""
    return present() - at_start - _BY_NBACCEL


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=_note_at_fork)
