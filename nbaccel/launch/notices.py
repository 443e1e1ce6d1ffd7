"""nbaccel's own one-line notices ("no GPU visible; ..."), said one way: on stdout, silenced by NBACCEL_QUIET=1.

They go to stdout, not stderr: they inform (a notebook shows stderr in red, as if something broke),
and errors are raised, never printed.

Example:
    >>> say("no GPU visible; launching 2 CPU processes on gloo")
    nbaccel: no GPU visible; launching 2 CPU processes on gloo
"""

from __future__ import annotations

import os
import sys

QUIET_VARIABLE = "NBACCEL_QUIET"


def quiet() -> bool:
    """True when the user asked for no notices (NBACCEL_QUIET=1, true, yes or on)."""
    return os.environ.get(QUIET_VARIABLE, "").strip().lower() in ("1", "true", "yes", "on")


def say(text: str) -> None:
    """Print ``nbaccel: <text>`` into the cell (resolved per call: a kernel swaps sys.stdout per cell)."""
    if not quiet():
        print(f"nbaccel: {text}", file=sys.stdout, flush=True)
