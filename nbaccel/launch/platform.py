"""Does this system have what nbaccel's launcher is built on? Linux: ``fork``, ``memfd_create``, pidfds.

``import nbaccel`` and the state API (``PartialState`` and friends, in one process) work anywhere;
starting ranks needs Linux. On macOS and Windows a launch says so in one line (a PreflightError)
instead of failing deep inside a fork or a memfd.

Example:
    >>> require_linux("notebook_launcher")  # on Linux: nothing to say
"""

from __future__ import annotations

import os
import sys

from nbaccel.errors import PreflightError

_NEEDED = ("fork", "memfd_create")  # without pidfd_open (Linux < 5.3) exits are polled instead


def missing() -> list[str]:
    """What this system lacks of what the launcher needs; empty on Linux."""
    lacking = [] if sys.platform.startswith("linux") else [f"Linux (this is {sys.platform})"]
    return lacking + [f"os.{name}" for name in _NEEDED if not hasattr(os, name)]


def require_linux(what: str) -> None:
    """Raise a one-line PreflightError naming ``what`` when ranks cannot be started here."""
    lacking = missing()
    if lacking:
        raise PreflightError(
            f"{what} needs Linux (fork, memfd, pidfd), and this system lacks {', '.join(lacking)}; PartialState and the state API work here "
            "in one process: run launches on Linux (WSL 2 on Windows, a Linux VM or container on macOS)."
        )
