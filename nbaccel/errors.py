"""Exceptions nbaccel raises. Every message says what was detected, why it breaks, and how to fix it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

# errors.py is the bottom layer: every layer imports it, so it imports none of them, not even for
# annotations (that made errors -> launch/outcome -> wire/events -> errors a cycle). What an error
# needs from a rank's outcome is said here as protocols; launch/outcome.py's RankOutcome and
# RemoteError satisfy them, and build the headline the error carries.


class RankErrorText(Protocol):
    """An exception raised on a rank, as text (``nbaccel.launch.outcome.RemoteError``)."""

    @property
    def type_name(self) -> str: ...
    @property
    def message(self) -> str: ...
    @property
    def traceback(self) -> str: ...


class RankReport(Protocol):
    """What became of one rank, as an error reports it (``nbaccel.launch.outcome.RankOutcome``)."""

    @property
    def rank(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def error(self) -> RankErrorText | None: ...
    @property
    def signal_name(self) -> str | None: ...
    @property
    def exitcode(self) -> int | None: ...
    @property
    def last_lines(self) -> Sequence[str]: ...
    @property
    def where(self) -> str: ...
    def describe(self) -> str:
        """One line, for summaries: 'rank 1: failed (ValueError: boom)'."""

    def headline(self, node: str = "") -> str:
        """Why it failed, in one line: 'rank 1 failed: ValueError: boom' ('rank 1 on <node> failed...')."""


class NbaccelError(Exception):
    """Base class of every error nbaccel raises on purpose.

    In IPython only the message is shown: it already says what was detected, why and how to
    fix it, and nbaccel's own stack would only bury it.
    """

    def _render_traceback_(self) -> list[str]:
        lines = str(self).splitlines() or [""]
        return [f"{type(self).__name__}: {lines[0]}", *lines[1:]]


class PreflightError(NbaccelError):
    """A check before forking found something that would break the launch; nothing was started."""


class RankFailedError(NbaccelError):
    """A rank raised, crashed or exited early; the others were stopped.

    The message starts with the root cause (``rank 1 failed: ValueError: boom``), then that
    rank's traceback as it ran there (the notebook cell's lines included), its last output lines
    and every rank's outcome. Attributes: ``rank``, ``exc_type`` (the exception's type name, or
    None for a crash), ``remote_traceback``, ``outcomes`` (every rank's RankOutcome) and
    ``attempts`` (the failed attempts' outcomes, when ``max_restarts`` relaunched).
    """

    def __init__(self, root: RankReport, outcomes: Sequence[RankReport]) -> None:
        self.rank = root.rank
        self.exc_type = root.error.type_name if root.error else None
        self.error_message = root.error.message if root.error else ""
        self.remote_traceback = root.error.traceback if root.error else ""
        self.signal_name = root.signal_name
        self.exitcode = root.exitcode
        self.last_lines = list(root.last_lines)
        self.outcomes: list[RankReport] = list(outcomes)
        self.attempts: Sequence[Sequence[RankReport]] = [self.outcomes]
        super().__init__(self._headline(root))

    @staticmethod
    def _headline(root: RankReport) -> str:
        return root.headline()  # the words of the view's banner and panel too

    def report(self) -> str:
        """The full text: headline, remote traceback, last output lines, every rank's outcome."""
        parts = [self.args[0]]
        if self.remote_traceback:
            parts.append(f"\nTraceback on rank {self.rank}:\n{self.remote_traceback.rstrip()}")
        if self.last_lines:
            tail = "\n".join(f"  {line}" for line in self.last_lines)
            parts.append(f"\nLast output of rank {self.rank}:\n{tail}")
        summary = "\n".join(f"  {o.describe()}" for o in self.outcomes)
        parts.append(f"\nAll ranks:\n{summary}")
        where = [f"  {o.where}" for o in self.outcomes if o.where]
        if where:
            parts.append("\nWhere the other ranks were when they were stopped:\n" + "\n".join(where))
        if len(self.attempts) > 1:
            parts.append(f"\n(after {len(self.attempts)} attempts; max_restarts was {len(self.attempts) - 1})")
        return "\n".join(parts)

    def __str__(self) -> str:
        return self.report()

    def _render_traceback_(self) -> list[str]:
        # IPython shows this instead of the kernel-side stack: the launcher's frames say nothing
        # about the user's bug, the rank's traceback does.
        lines = self.report().splitlines()
        return [f"RankFailedError: {lines[0]}", *lines[1:]]

    def __reduce__(self) -> tuple[Any, tuple[dict[str, Any]]]:  # picklable across processes (e.g. a pool relaying it)
        return (_rebuild_rank_failed, (self.__dict__,))


def _rebuild_rank_failed(state: dict[str, Any]) -> RankFailedError:
    error = RankFailedError.__new__(RankFailedError)
    error.__dict__.update(state)
    error.args = (RankFailedError._headline(_outcome_of(state)),)
    return error


def _outcome_of(state: dict[str, Any]) -> RankReport:
    outcomes: list[RankReport] = state["outcomes"]
    return next(o for o in outcomes if o.rank == state["rank"])


class LaunchTimeoutError(NbaccelError, TimeoutError):
    """The launch's ``timeout`` passed; every rank was stopped.

    ``running`` maps each rank that was still running to its last output line.
    """

    def __init__(self, timeout: float, running: dict[int, str], outcomes: Sequence[RankReport], what: str = "launch", option: str = "timeout") -> None:
        self.timeout = timeout
        self.running = running
        self.outcomes: list[RankReport] = list(outcomes)
        where = {o.rank: o.where for o in outcomes if o.where}
        lines = [_running_line(rank, line, where.get(rank)) for rank, line in running.items()]
        super().__init__(
            f"{what} timed out after {timeout:g} s and was stopped; ranks still running:\n"
            + "\n".join(lines)
            + f"\nRaise {option}= (or pass {option}=None) if the work needs longer, or look at why those ranks hang."
        )


def _running_line(rank: int, line: str, where: str | None) -> str:
    said = f"last output: {line!r}" if line else "no output yet"
    return f"  rank {rank}: {said}" + (f"\n    {where}" if where else "")


class FrameError(NbaccelError):
    """An event frame this nbaccel cannot read: another format version, or an unknown kind.

    Both ends of a local stream are the same nbaccel, so this means a corrupted stream (or mixed
    installations across machines): the rank is treated as failed rather than its bytes guessed at.
    """


class CheckpointError(NbaccelError, ValueError):
    """``pool.save`` / ``pool.load`` refused on every rank before any tensor was written or read:
    the path, the folder or the keys are named; the workers keep running."""


class EngineStateError(NbaccelError):
    """nbaccel's engine was asked to do something out of order (a bug in nbaccel: please report it)."""
