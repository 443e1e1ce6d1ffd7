"""Calls whose code is the rank's own: the kernel names the code, the rank runs it.

A rank runs what the kernel sends it: a launch's function, or a persistent worker's callable over
its namespace (``nbaccel.pool.worker_calls``). Some of those must run code of the rank's own
modules (its post-mortem, its profiler, its count of collectives, the gathers of a sharded value):
the kernel must not import those modules to build them. So it sends one of these instead:

- a ``RankCall`` member: a name, for the worker calls of ``nbaccel.rank.serve``'s own loop;
- a ``RankCode`` (a dataclass): its fields are the data, its ``code`` names the rank's function
  as ``"module:function"``; called on the rank, it imports that module there (as unpickling a
  function by reference would) and calls ``function(*args, **fields)``.

Both pickle by reference, as ``Job`` does, and mean the same on both sides;
``tests/wire/test_rank_calls.py`` checks that each ``code`` names a rank function taking the fields.

Example:
    >>> RankCall.COLLECTIVE_COUNT.value
    'collective_count'
    >>> PostMortemOnError.code
    'nbaccel.rank.debugger:call_with_post_mortem'
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

RANK_PACKAGE = "nbaccel.rank."


class RankCall(enum.Enum):
    """A worker call the rank answers with its own code (see ``nbaccel.rank.serve``)."""

    DEBUG_LAST_FAILURE = "debug_last_failure"  # the post-mortem of the rank's last failed cell: False without one
    COLLECTIVE_COUNT = "collective_count"  # the default group's count of collectives (None: no group)


class RankCode:
    """A call of a rank module's function: the subclass is a dataclass whose fields are its
    keyword arguments, ``code`` names the function (``"nbaccel.rank.module:function"``)."""

    code: ClassVar[str]

    def __call__(self, *args: Any) -> Any:
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}  # type: ignore[arg-type]
        return rank_function(self.code)(*args, **fields)


def rank_function(code: str) -> Callable[..., Any]:
    """The function ``code`` names, its module imported here (on the rank that runs it).

    >>> rank_function("nbaccel.rank.debugger:call_with_post_mortem").__name__
    'call_with_post_mortem'
    """
    module, _, name = code.partition(":")
    if not module.startswith(RANK_PACKAGE) or not name:
        raise ValueError(f"{code!r} names no function of the rank's modules: a RankCode's code is 'nbaccel.rank.<module>:<function>'")
    function: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return function


@dataclass
class PostMortemOnError(RankCode):
    """Call ``function``; if it raises, open the post-mortem before the error is reported (``--pdb``).

    Peers are left waiting meanwhile: the kernel stops them only once the error arrives.
    """

    code: ClassVar[str] = "nbaccel.rank.debugger:call_with_post_mortem"
    function: Any


@dataclass
class Profiled(RankCode):
    """``function(*args)`` run under torch.profiler; the trace goes to the kernel at the end (``--profile``)."""

    code: ClassVar[str] = "nbaccel.rank.profiling:call_profiled"
    function: Callable[..., Any]
