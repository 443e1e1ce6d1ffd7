"""Rank side of the debugger: pdb on a rank, its prompt answered from the notebook's own stdin.

A rank has no terminal: the kernel owns the notebook's stdin. So the rank's pdb reads and writes
through the rank's own streams: what pdb prints and its prompt go to the kernel as one ``PROMPT``
event on the rank's channel, and the line typed in the notebook comes back as an ``ANSWER`` frame
on the rank's command pipe (``nbaccel.launch.debug_desk`` is the kernel's side). ``install``
points ``breakpoint()``, ``pdb.set_trace()``, ``pdb.Pdb`` and ``input()`` at it, replacing the
debugpy hook a fork inherits from ipykernel (which skips every breakpoint without a client).
Nothing runs until a breakpoint is hit: a launch without one pays two attribute stores.

Example (what ``run_rank`` does, and what a breakpoint then finds)::

    install(rank=1, channel=ends.channel, commands=ends.commands)
    breakpoint()  # PROMPT "(Pdb) rank 1> " in the notebook; "c" goes on
"""

from __future__ import annotations

import bdb
import builtins
import importlib
import io
import linecache
import os
import pdb
import sys
import warnings
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from nbaccel.wire import events

# A %%distributed cell runs as a function of this name over the cell's whole text (nbaccel.notebook.cell),
# whose first line is the magic's, not Python: ``ll`` shows the whole cell instead of that line.
_CELL_FUNCTION = "distributed_cell"
# The standard library's Pdb, even where ipykernel put IPython's debugger in its place.
_STDLIB_PDB: type[pdb.Pdb] = next(c for c in pdb.Pdb.__mro__ if c.__module__ == "pdb" and c.__name__ == "Pdb")


class _Link:
    """The rank's end of the debugger's conversation with the kernel."""

    def __init__(self, rank: int, channel: int, commands: int | None) -> None:
        self.rank, self.channel, self.commands = rank, channel, commands
        self.header: str | None = None  # said once, in the first prompt of a session

    def ask(self, prompt: str, text: str, where: tuple[str, int] | None) -> dict[str, Any] | None:
        """Send the prompt; block until the kernel answers. None: no answer can come (no command pipe)."""
        if self.commands is None:
            return None
        header, self.header = self.header, None
        events.send(self.channel, events.Kind.PROMPT, {"prompt": prompt, "text": text, "where": where, "header": header})
        frame = events.read_frame(self.commands)
        answer = frame.value() if frame is not None and frame.kind is events.Kind.ANSWER else None
        return answer if isinstance(answer, dict) else None

    def said(self, text: str) -> None:
        if text:
            events.send(self.channel, events.Kind.DEBUG_OUTPUT, {"text": text})

    def left(self) -> None:
        events.send(self.channel, events.Kind.DEBUG_LEFT, None)


_link: _Link | None = None
_last_failure: BaseException | None = None  # a persistent worker's last error, for ``post_mortem_last``


class _Output(io.StringIO):
    """pdb's stdout: held until its next prompt (or the end of the session), then sent whole."""

    def take(self) -> str:
        text = self.getvalue()
        self.seek(0)
        self.truncate()
        return text


class _Input:
    """pdb's stdin: each line read is a prompt in the notebook."""

    def __init__(self, debugger: RankPdb) -> None:
        self.debugger = debugger

    def readline(self) -> str:
        return self.debugger.read_command()


class RankPdb(_STDLIB_PDB):  # type: ignore[misc, valid-type]
    """The standard pdb, its stdin and stdout a channel to the kernel, its prompt naming the rank."""

    def __init__(self, completekey: str = "tab", stdin: Any = None, stdout: Any = None, skip: Any = None, nosigint: bool = False, readrc: bool = True) -> None:
        link = _link
        self._rank = link.rank if link is not None else int(os.environ.get("RANK", "0"))
        self._output = _Output()
        # nosigint: an interrupt belongs to nbaccel's policy (stop the launch), not to pdb.
        super().__init__(completekey, _Input(self), self._output, skip=skip, nosigint=True, readrc=readrc)
        self.use_rawinput = False
        self.prompt = f"(Pdb) rank {self._rank}> "

    def read_command(self) -> str:
        text = self._output.take()
        body, _, prompt = text.rpartition("\n") if not text.endswith("\n") else (text, "", "")
        link = _link
        answer = link.ask(prompt or self.prompt, body + ("\n" if body else ""), self._where()) if link is not None else None
        if answer is None:
            return "continue\n"  # nobody can answer: go on, as PYTHONBREAKPOINT=0 would
        if "skip" in answer:
            return "continue\n"  # the frontend has no stdin; the kernel said so in one line
        line = answer.get("line")
        return "EOF\n" if line is None else f"{line}\n"

    def _where(self) -> tuple[str, int] | None:
        frame = getattr(self, "curframe", None)
        return (frame.f_code.co_filename, frame.f_lineno) if frame is not None else None

    def _getsourcelines(self, obj: Any) -> tuple[list[str], int]:
        code = getattr(obj, "f_code", None)
        if code is not None and code.co_name == _CELL_FUNCTION:
            lines = linecache.getlines(code.co_filename, obj.f_globals)
            if lines:
                return lines, 1
        return super()._getsourcelines(obj)  # type: ignore[no-any-return]

    def _cmdloop(self) -> None:
        # The standard pdb catches KeyboardInterrupt here and prompts again: at a rank's prompt an
        # interrupt is the notebook's stop button, which must end the rank's work, so let it through.
        self.allow_kbdint = True
        self.cmdloop()
        self.allow_kbdint = False

    def interaction(self, frame: FrameType | None, traceback: Any) -> None:
        try:
            super().interaction(frame, traceback)
        finally:
            link = _link
            if link is not None:
                link.said(self._output.take())
                link.left()


def set_trace(*, header: str | None = None) -> None:
    """``pdb.set_trace()`` on a rank: stop in the caller's frame, with the prompt in the notebook."""
    debugger = RankPdb()
    if header is not None:
        debugger.message(header)
    _open_session("breakpoint")
    debugger.set_trace(sys._getframe().f_back)


def breakpointhook(*args: Any, **kwargs: Any) -> Any:
    """``sys.breakpointhook`` on a rank, reading ``PYTHONBREAKPOINT`` on each call as Python does:
    unset or empty, nbaccel's rank pdb; ``0``, nothing; another dotted name, that callable."""
    hookname = os.environ.get("PYTHONBREAKPOINT", "")
    if hookname == "0":
        return None
    if hookname in ("", "pdb.set_trace"):
        debugger = RankPdb()
        _open_session("breakpoint")
        debugger.set_trace(sys._getframe().f_back)
        return None
    module_name, _, attribute = hookname.rpartition(".")
    try:
        hook = getattr(importlib.import_module(module_name or "builtins"), attribute)
    except (ImportError, AttributeError):
        warnings.warn(f"Ignoring unimportable $PYTHONBREAKPOINT: {hookname!r}", RuntimeWarning, stacklevel=2)
        return None
    return hook(*args, **kwargs)


def _open_session(kind: str) -> None:
    if _link is not None:
        _link.header = kind


def post_mortem(error: BaseException) -> None:
    """Open pdb at ``error``'s frame (in the user's code, not nbaccel's), prompt in the notebook."""
    traceback = _user_traceback(error.__traceback__)
    if traceback is None or _link is None:
        return
    _open_session(f"post-mortem:{type(error).__qualname__}: {error}")
    debugger = RankPdb()
    debugger.reset()
    debugger.interaction(None, traceback)


def _user_traceback(traceback: TracebackType | None) -> TracebackType | None:
    """Skip nbaccel's own frames: the post-mortem starts in the user's code."""
    while traceback is not None and traceback.tb_next is not None and traceback.tb_frame.f_globals.get("__name__", "").startswith("nbaccel."):
        traceback = traceback.tb_next
    return traceback


def remember_failure(error: BaseException) -> None:
    """Keep a worker's last error (with its frames) for a later ``%distributed debug``."""
    global _last_failure
    if not isinstance(error, (KeyboardInterrupt, bdb.BdbQuit)):
        _last_failure = error


@dataclass
class PostMortemOnError:
    """Call ``function``; if it raises, open the post-mortem before the error is reported (``--pdb``).

    Peers are left waiting meanwhile: the kernel stops them only once the error arrives.
    """

    function: Any

    def __call__(self, *args: Any) -> Any:
        try:
            return self.function(*args)
        except (KeyboardInterrupt, SystemExit, bdb.BdbQuit):
            raise
        except BaseException as error:
            post_mortem(error)
            raise


def debug_last_failure(namespace: dict[str, Any]) -> bool:
    """A worker's post-mortem of its last failed cell (``pool.debug``, sent as
    ``RankCall.DEBUG_LAST_FAILURE``); False when the rank has no failure to look at."""
    if _last_failure is None:
        return False
    post_mortem(_last_failure)
    return True


def install(rank: int, channel: int, commands: int | None) -> None:
    """Route every way into pdb on this rank through the kernel."""
    global _link
    _link = _Link(rank, channel, commands)
    sys.breakpointhook = breakpointhook
    pdb.Pdb = RankPdb  # type: ignore[misc]  # pdb.Pdb().set_trace() and libraries that make their own
    pdb.set_trace = set_trace
    builtins.input = _input


_kept: list[Any] = []  # what install replaces, as the kernel had it at the last fork (see prepare)


def prepare() -> None:
    """Kernel side, before a fork (``os.register_at_fork``): hold what ``install`` replaces in a
    rank (ipykernel's per-cell ``input``, debugpy's breakpoint hook, pdb's own), so the rank
    drops no last reference: freeing them there would write to the kernel's pages.

    Example:
        >>> prepare(); _kept[0] is sys.breakpointhook
        True
    """
    _kept[:] = (sys.breakpointhook, pdb.Pdb, pdb.set_trace, builtins.input)


def _input(prompt: object = "") -> str:
    """``input()`` on a rank: a prompt in the notebook (the fork's copy of ipykernel's would hang)."""
    link = _link
    answer = link.ask(str(prompt), "", None) if link is not None else None
    if link is not None:
        link.left()
    if answer is None or "skip" in answer or answer.get("line") is None:
        raise EOFError(f"rank {link.rank if link else '?'}: no stdin to read from (this frontend does not allow input)")
    return str(answer["line"])


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=prepare)
