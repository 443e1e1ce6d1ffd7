"""What crosses the fork: the job every rank runs, and the ends of a rank's pipes as the rank sees them.

Both sides import it: the kernel builds a ``Job`` and the ``ChildEnds``, the rank's bootstrap reads
them; a spawned rank finds its ends at the fd numbers below.

Example:
    >>> Job(print, ("hello",)).args
    ('hello',)
    >>> ChildEnds(stdout=1, stderr=2, channel=5).commands is None
    True
    >>> job_label(len), job_label(lambda: 0)  # what a rank runs, in its process title
    ('len', '<lambda>')
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


# Where a spawned rank finds its ends: the kernel's spawn (nbaccel.launch.starters.spawn) puts them
# there, the new interpreter's entry (nbaccel.rank.spawn_entry) builds its ChildEnds from them.
CHANNEL_FD = 3  # the event pipe
COMMANDS_FD = 4  # the command pipe, for persistent workers
SHARED_FD = 5  # the fd socket for shared memory (nbaccel.wire.shm)
ATTACHED_FD = 10  # the memfds of the job's big arguments, from here on


def job_label(function: Any) -> str | None:
    """What a rank runs, in a word: a cell's ``label`` (``cell [12]``) or the function's name.

    Wrappers nbaccel puts around the user's function (``--pdb``'s post-mortem, a job carried to
    a node by value, ``functools.partial``) are looked through.

    Example:
        >>> import functools
        >>> job_label(functools.partial(print, "hi"))
        'print'
    """
    for _ in range(8):  # wrappers of wrappers, bounded
        label = getattr(function, "label", None)
        if isinstance(label, str) and label:
            return label
        inner = getattr(function, "function", None) or getattr(function, "func", None)
        if inner is None or inner is function:
            break
        function = inner
    name = getattr(function, "__qualname__", None) or getattr(function, "__name__", None) or type(function).__qualname__
    return str(name).rsplit(".<locals>.", 1)[-1] if name else None  # "train", not "main.<locals>.train"
