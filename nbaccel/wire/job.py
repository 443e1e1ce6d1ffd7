"""What crosses the fork: the job every rank runs, and the ends of a rank's pipes as the rank sees them.

Both sides import it: the kernel builds a ``Job`` and the ``ChildEnds``, the rank's bootstrap reads them.

Example:
    >>> Job(print, ("hello",)).args
    ('hello',)
    >>> ChildEnds(stdout=1, stderr=2, channel=5).commands is None
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class Job:
    """The function every rank runs, with its positional arguments.

    With ``pass_ends`` the function also gets the rank's ChildEnds first (persistent workers
    read their commands from ``ends.commands``).
    """

    function: Callable[..., Any]
    args: tuple[Any, ...] = ()
    pass_ends: bool = False
    label: str | None = None  # what the ranks run, in ps: "cell [12]", "train" (made once, in the kernel)


@dataclass(frozen=True)
class ChildEnds:
    """The write ends of one rank's pipes, as the rank sees them."""

    stdout: int
    stderr: int
    channel: int
    commands: int | None = None  # read end of the kernel's commands (persistent workers only)
    shared: int | None = None  # the rank's end of its fd socket (nbaccel.wire.shm); None: values in-band
