"""Kernel side of the debugger: a rank's pdb prompt shown in the cell, one rank at a time.

A rank at a breakpoint sends ``PROMPT`` (``nbaccel.rank.debugger``); the loop hands it here. The
prompt is asked on the notebook's own stdin (Jupyter's ``input_request``) from a helper thread
that carries the cell's context, so the loop keeps relaying every rank's output meanwhile; the
line typed comes back to the loop through a pipe and goes to the rank as ``ANSWER``. Turns: a
rank keeps the prompt for its whole session (until ``DEBUG_LEFT``, plus a moment for ``n`` and
``s``, which leave and re-enter), then the lowest rank waiting has it. While any rank is in the
debugger the loop's clocks (``timeout=``, the stall report) stand still. Where the frontend
allows no stdin (nbclient, nbconvert, a script) the rank is told to go on, and one line says so.

Example::

    desk = DebugDesk(loop)        # made by the loop at the first PROMPT of a launch
    desk.on_event(1, Kind.PROMPT, {"prompt": "(Pdb) rank 1> ", "text": "...", ...})
    desk.close()                  # the loop's end: a prompt still open is withdrawn
"""

from __future__ import annotations

import contextvars
import ctypes
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from nbaccel.launch import ipython_pdb
from nbaccel.launch.outcome import with_cell_names
from nbaccel.launch.seam import RankGroup, Sink
from nbaccel.wire import events
from nbaccel.wire.events import Kind
from nbaccel.wire.job import Job, job_label
from nbaccel.wire.rank_calls import PostMortemOnError

Ask = Callable[[str], str]  # the kernel's raw_input: a prompt in, the typed line out

_KEEP_TURN = 0.3  # after a session ends: ``n``/``s`` leave the debugger and re-enter it at once
_GATHER = 0.1  # with no rank at the prompt: ranks stopping this close together count as together
DEBUG_KINDS = (Kind.PROMPT, Kind.DEBUG_OUTPUT, Kind.DEBUG_LEFT)
TIMEOUTS_LINE = (
    "its peers wait for it up to torch's process-group timeout (30 min on gloo, 10 min on NCCL, whose watchdog then "
    "ends them; nbaccel's timeout= and stall clocks are paused); lengthen it with "
    "init_process_group(timeout=timedelta(hours=2)) or Accelerate's InitProcessGroupKwargs(timeout=...)"
)
NO_STDIN = "this frontend does not allow input (nbclient, nbconvert --execute, a script)"


class _Cancelled(BaseException):
    """Raised in the helper thread to withdraw a prompt nobody will answer (an interrupt, a rank gone)."""


def kernel_stdin() -> Ask | None:
    """The running kernel's ``raw_input`` if the cell's frontend allows stdin, else None."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return None
    try:
        allowed = bool(kernel.get_parent("shell")["content"].get("allow_stdin", False))
    except (AttributeError, KeyError, TypeError):
        return None
    return kernel.raw_input if allowed else None


def wants_post_mortem(pdb: bool | None) -> bool:
    """``pdb=`` as given, or (None) IPython's own ``%pdb`` setting in this kernel.

    Example:
        >>> wants_post_mortem(True), wants_post_mortem(False)
        (True, False)
    """
    if pdb is not None:
        return pdb  # as given: LaunchOptions refuses what is not a bool
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return bool(getattr(shell, "call_pdb", False))


def debuggable_job(function: Callable[..., Any], args: Any, post_mortem: bool) -> Job:
    """The job every rank runs: ``function(*args)``, in a post-mortem on error when asked."""
    # Labelled here, once per launch: a rank making the words itself would copy more pages.
    return Job(PostMortemOnError(function) if post_mortem else function, tuple(args), label=job_label(function))


def first_line(rank: int, header: str) -> str:
    """The prompt's first line: what stopped the rank, and how long its peers may wait.

    Example:
        >>> first_line(1, "breakpoint").split(";")[0]
        'nbaccel: rank 1 is at a breakpoint (c continues, q ends the rank and fails the launch)'
    """
    if header.startswith("post-mortem:"):
        what = f"rank {rank} raised {header.split(':', 1)[1].strip()}; post-mortem in its frame (q or c ends it, then the launch fails)"
    else:
        what = f"rank {rank} is at a breakpoint (c continues, q ends the rank and fails the launch)"
    return f"nbaccel: {what}; {TIMEOUTS_LINE}"


class DeskLoop(Protocol):
    """What the desk needs of the loop it serves (``nbaccel.launch.loop.EventLoop``): its sink and
    group, a reader for the helper thread's answers, the ranks' lines, and its clocks."""

    @property
    def sink(self) -> Sink:
        """Where the prompts' text goes."""

    @property
    def group(self) -> RankGroup:
        """The ranks the answers are sent to."""

    def add_reader(self, fd: int, handler: Callable[[], None], order: tuple[int, int]) -> None:
        """Call ``handler`` when ``fd`` is readable."""

    def remove_reader(self, fd: int) -> None:
        """Stop watching ``fd``."""

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        """Show lines as ``rank``'s output."""

    def hold_clocks(self) -> None:
        """A rank is in the debugger: ``timeout=`` and the stall report wait."""

    def release_clocks(self) -> None:
        """No rank is in the debugger any more: the clocks go on."""


class DebugDesk:
    """Every rank's debugger prompt of one loop, asked on the kernel's stdin one at a time."""

    def __init__(self, loop: DeskLoop, ask: Ask | None = None) -> None:
        self.loop = loop
        self.ask = ask if ask is not None else kernel_stdin()
        self.holder: int | None = None  # the rank whose session has the prompt
        self.waiting: dict[int, dict[str, Any]] = {}  # rank -> its PROMPT, not yet asked
        self.in_debugger: set[int] = set()  # ranks between their first PROMPT and DEBUG_LEFT
        self._keep_until: float | None = None
        self._thread: threading.Thread | None = None
        self._asked: int | None = None  # the rank whose prompt the helper thread is asking
        self._answer: tuple[int, str | None, BaseException | None] | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        loop.add_reader(self._wake_r, self._on_answer, (-2, 0))

    # -- from the loop ---------------------------------------------------------------------------

    def on_event(self, rank: int, kind: Kind, body: Any) -> None:
        if kind is Kind.DEBUG_OUTPUT:
            self._show(rank, body.get("text", ""))
        elif kind is Kind.DEBUG_LEFT:
            self.in_debugger.discard(rank)
            if rank == self.holder:
                self._keep_until = time.monotonic() + _KEEP_TURN
            self._update_clocks()
        elif kind is Kind.PROMPT:
            self._on_prompt(rank, body)

    def _on_prompt(self, rank: int, body: dict[str, Any]) -> None:
        if str(body.get("header") or "").startswith("post-mortem:"):
            ipython_pdb.spare_cell(rank)  # with %pdb on, IPython would then debug nbaccel's own frames
        if self.ask is None:
            self._skip(rank, body)
            return
        self.in_debugger.add(rank)
        self.waiting[rank] = body
        if self.holder is None and self._keep_until is None:
            self._keep_until = time.monotonic() + _GATHER
        self._update_clocks()
        # Granted in on_clock, a moment later: ranks that stopped together (a breakpoint after
        # a barrier) are then served lowest first, whichever PROMPT the loop read first.

    def wake_at(self) -> float | None:
        return self._keep_until if self.waiting and self._asked is None else None

    def on_clock(self, now: float) -> None:
        if self._asked is not None or not self.waiting:
            return
        if self.holder is not None and self.holder not in self.waiting:
            if self.holder in self.in_debugger or (self._keep_until is not None and now < self._keep_until):
                return  # the holder's session goes on (it is between two prompts)
            self.holder = None
        elif self.holder is None and self._keep_until is not None and now < self._keep_until:
            return  # gathering the ranks that stop together
        rank = self.holder if self.holder is not None else min(self.waiting)
        self.holder, self._keep_until = rank, None
        self._start_asking(rank, self.waiting.pop(rank))

    def rank_ended(self, rank: int) -> None:
        """``rank`` exited: forget its prompt, and withdraw the one being asked for it."""
        self.waiting.pop(rank, None)
        self.in_debugger.discard(rank)
        if self._asked == rank:
            self._withdraw()
        if self.holder == rank:
            self.holder = None
        self._update_clocks()

    def interrupted(self) -> None:
        """The stop button: the prompt box is withdrawn; the ranks are stopped by the policy."""
        self._withdraw()
        self.waiting.clear()

    def close(self) -> None:
        self._withdraw()
        self.loop.remove_reader(self._wake_r)
        os.close(self._wake_r)
        os.close(self._wake_w)
        self.loop.release_clocks()

    # -- asking ----------------------------------------------------------------------------------

    def _start_asking(self, rank: int, body: dict[str, Any]) -> None:
        text = str(body.get("text") or "")
        self._show(rank, text)
        prompt = str(body.get("prompt", f"(Pdb) rank {rank}> "))
        if not getattr(self.loop.sink, "lines_in_cell", False):
            # The rank's view is elsewhere (a widget tab, a file): pdb's lines go beside the box too.
            # Where the sink prints them into the cell (``[rank 1] ...``), they are there once already.
            prompt = text + prompt
        header = body.get("header")
        if header:
            prompt = first_line(rank, str(header)) + "\n" + prompt
        self._asked = rank
        context = contextvars.copy_context()  # the cell's: ipykernel finds its request there
        self._thread = threading.Thread(target=context.run, args=(self._ask_in_thread, rank, prompt), name=f"nbaccel-stdin-rank-{rank}", daemon=True)
        self._thread.start()

    def _ask_in_thread(self, rank: int, prompt: str) -> None:
        assert self.ask is not None
        try:
            line: str | None = self.ask(prompt)
            error: BaseException | None = None
        except _Cancelled:
            return
        except EOFError:
            line, error = None, None
        except BaseException as exc:  # noqa: BLE001 - StdinNotImplementedError and the like: tell the loop
            line, error = None, exc
        self._answer = (rank, line, error)
        try:
            os.write(self._wake_w, b"\0")
        except OSError:  # the desk closed meanwhile
            pass

    def _on_answer(self) -> None:
        try:
            os.read(self._wake_r, 64)
        except BlockingIOError:
            return
        answer, self._answer = self._answer, None
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._asked = None
        if answer is None:
            return
        rank, line, error = answer
        reply: dict[str, Any] = {"skip": repr(error)} if error is not None else {"line": line}
        self._send(rank, reply)

    def _withdraw(self) -> None:
        thread, self._thread = self._thread, None
        self._asked = None
        if thread is None or not thread.is_alive() or thread.ident is None:
            return
        # ipykernel waits for the reply in Python, 10 ms at a time: an exception set in that
        # thread ends the wait, so no stale prompt takes the answer meant for a later cell.
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(_Cancelled))
        thread.join(timeout=2.0)

    def _skip(self, rank: int, body: dict[str, Any]) -> None:
        where = body.get("where")
        place = f" at {_place(where[0], int(where[1]))}" if where else ""
        what = "a post-mortem" if str(body.get("header") or "").startswith("post-mortem") else "a breakpoint"
        self.loop.sink.output(rank, "stderr", [f"nbaccel: rank {rank} passed {what}{place} without stopping: {NO_STDIN}"])
        self._send(rank, {"skip": NO_STDIN})

    def _send(self, rank: int, reply: dict[str, Any]) -> None:
        try:
            self.loop.group.send(rank, Kind.ANSWER, events.dumps(reply))
        except OSError:  # the rank is gone: its exit is reported on its own
            pass

    def _show(self, rank: int, text: str) -> None:
        if text:
            self.loop.lines(rank, "stdout", text.splitlines())

    def _update_clocks(self) -> None:
        if self.in_debugger or self.waiting:
            self.loop.hold_clocks()
        else:
            self.loop.release_clocks()


def _place(filename: str, line: int) -> str:
    """``Cell In[3], line 4`` for a notebook cell, else ``file, line 4``."""
    named = with_cell_names(f'File "{filename}", line {line}')
    return named if named.startswith("Cell In") else f"{filename}, line {line}"
