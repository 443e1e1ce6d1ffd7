"""nbaccel's own one-line notices ("no GPU visible; ..."), said one way: on stdout, silenced by NBACCEL_QUIET=1.

They go to stdout, not stderr: they inform (a notebook shows stderr in red, as if something broke),
and errors are raised, never printed.

Example:
    >>> say("no GPU visible; launching 2 CPU processes on gloo")
    nbaccel: no GPU visible; launching 2 CPU processes on gloo
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

QUIET_VARIABLE = "NBACCEL_QUIET"
_kept: list[list[str]] = []  # while ``kept()`` runs: notices go here instead of into the cell


def quiet() -> bool:
    """True when the user asked for no notices (NBACCEL_QUIET=1, true, yes or on)."""
    return os.environ.get(QUIET_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


@contextlib.contextmanager
def kept() -> Iterator[list[str]]:
    """Keep the notices said inside in a list instead of printing them: ``nbaccel.plan()`` shows what
    a launch would say.

    >>> with kept() as notices:
    ...     say("no GPU visible")
    >>> notices
    ['no GPU visible']
    """
    notices: list[str] = []
    _kept.append(notices)
    try:
        yield notices
    finally:
        _kept.remove(notices)


def say(text: str) -> None:
    """Print ``nbaccel: <text>`` into the cell (resolved per call: a kernel swaps sys.stdout per cell)."""
    if _kept:
        _kept[-1].append(text)
    elif not quiet():
        print(f"nbaccel: {text}", file=sys.stdout, flush=True)
