"""IPython's own ``%pdb`` post-mortem, spared for a launch error whose rank already had nbaccel's.

With ``%pdb on`` IPython opens its debugger on every exception a cell raises, right after showing
its traceback (``InteractiveShell.showtraceback`` calls ``shell.debugger(force=True)``). When the
failing rank's own post-mortem was offered (``--pdb``, ``pdb=True``, or ``%pdb on`` itself), that
second debugger would open on the kernel's ``RankFailedError``: nbaccel's frames, nothing of the
user's. ``spare_cell(rank)`` puts a wrapper over the shell's ``debugger`` for the rest of the
cell that skips it for a ``RankFailedError`` naming that rank, and for nothing else: another
exception of the same cell still gets IPython's debugger, and ``%debug`` in a later cell still
opens the kernel-side one. IPython's ``post_run_cell`` event takes the wrapper away.

Example:
    >>> spare_cell(1)  # outside IPython: nothing to spare
    >>> spared(RankFailedError.__new__(RankFailedError), {1})  # no rank yet: not one of ours
    False
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from nbaccel.errors import RankFailedError


def spare_cell(rank: int) -> None:
    """For the rest of the running cell, IPython's ``%pdb`` skips the ``RankFailedError`` of ``rank``."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "events") or not callable(getattr(shell, "debugger", None)):
        return
    current = shell.__dict__.get("debugger")
    if isinstance(current, _SparingDebugger):
        current.ranks.add(rank)  # a second post-mortem in the same cell (two launches, restarts)
        return
    wrapper = _SparingDebugger(shell, {rank}, current)
    shell.debugger = wrapper
    shell.events.register("post_run_cell", wrapper.remove)


def spared(error: object, ranks: set[int]) -> bool:
    """Whether ``error`` is a launch failure of one of ``ranks`` (their post-mortem was offered)."""
    return isinstance(error, RankFailedError) and getattr(error, "rank", None) in ranks


class _SparingDebugger:
    """``shell.debugger`` for one cell: IPython's, except for the spared ranks' failures."""

    def __init__(self, shell: Any, ranks: set[int], shadowed: Callable[..., Any] | None) -> None:
        self.shell, self.ranks = shell, ranks
        self.shadowed = shadowed  # an instance attribute someone else set before us, kept as it was

    def __call__(self, force: bool = False) -> None:
        if spared(getattr(sys, "last_value", None), self.ranks):
            return  # the user looked at the failing rank's frames already; these are nbaccel's
        original = self.shadowed or functools.partial(type(self.shell).debugger, self.shell)
        original(force)

    def remove(self, *result: Any) -> None:
        """The cell is over: the shell's own ``debugger`` again (``post_run_cell`` calls this)."""
        if self.shell.__dict__.get("debugger") is self:
            if self.shadowed is None:
                del self.shell.debugger
            else:
                self.shell.debugger = self.shadowed
        try:
            self.shell.events.unregister("post_run_cell", self.remove)
        except ValueError:  # already taken away
            pass
