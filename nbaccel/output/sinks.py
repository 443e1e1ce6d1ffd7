"""Where relayed output goes. A Sink receives whole lines and events per rank, in the kernel.

Sinks are called from the kernel's main thread (the cell that launched), so they may print into
the cell or update widgets directly. They have no clock of their own: the kernel's event loop
asks ``tick_in()`` how soon a sink wants a ``tick()`` (to push lines it held back, to move a
clock, to end a view) and wakes up for it. ``TeeSink`` sends every call to several sinks.

Example:
    >>> sink = TextSink()
    >>> sink.output(1, "stdout", ["loss 0.25"])  # prints "[rank 1] loss 0.25"
    [rank 1] loss 0.25
    >>> both = TeeSink(sink, CollectingSink())
    >>> both.output(0, "stdout", ["hello"])
    [rank 0] hello
    >>> both.sinks[1].text(0), both.tick_in()
    (['hello'], None)
    >>> both.lines_in_cell, CollectingSink().lines_in_cell  # the text sink prints into the cell
    (True, False)
"""

from __future__ import annotations

import string
import sys
from collections.abc import Callable, Sequence
from typing import Any

from nbaccel.launch.outcome import RankOutcome
from nbaccel.launch.seam import Sink as Sink  # an explicit re-export (mypy strict); the protocol the engine calls; every class here implements it
from nbaccel.wire.rank_env import ROLE_NAME

LinePrefix = Callable[[int], str]  # a rank's index in the launch -> the text before each of its lines


def line_prefix(template: str | None = None, first_rank: int = 0) -> LinePrefix:
    """The prefix of a rank's text lines: ``[rank N]`` and a space, or torch elastic's ``log_line_prefix_template``
    with ``${role_name}``, ``${rank}`` (global) and ``${local_rank}`` filled in (``safe_substitute``:
    another ``$name`` stays as written). ``first_rank``: this node's first global rank.

    >>> line_prefix()(1), line_prefix(first_rank=4)(1)
    ('[rank 1] ', '[rank 5] ')
    >>> line_prefix("[${role_name}${rank}|${local_rank}]: ", first_rank=2)(1)
    '[default3|1]: '
    """
    if template is None:
        return lambda rank: f"[rank {first_rank + rank}] "
    compiled = string.Template(template)
    return lambda rank: compiled.safe_substitute(role_name=ROLE_NAME, rank=first_rank + rank, local_rank=rank)


class TextSink:
    """Prints each line into the cell labelled with its rank: ``[rank 1] ...``.

    stdout lines go to ``sys.stdout`` and stderr lines to ``sys.stderr`` (so notebooks show
    them as they show any stderr). Used headless, under nbclient, and with ``--text``.
    """

    lines_in_cell = True  # a rank's lines are in the cell itself: a debugger prompt need not repeat them

    def __init__(self, stdout: Any = None, stderr: Any = None) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._written: set[str] = set()  # streams to flush at the end (a flush blocks in a kernel)
        self.prefix: LinePrefix = line_prefix()  # log_line_prefix_template= replaces it

    def _stream(self, name: str) -> Any:
        # Resolved per call: inside a kernel sys.stdout is replaced per cell.
        if name == "stderr":
            return self._stderr or sys.stderr
        return self._stdout or sys.stdout

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        pass

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        prefix = self.prefix(rank)
        self._stream(stream).write("".join(f"{prefix}{line}\n" for line in lines))
        self._written.add(stream)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        text = event.get("text")
        if text:
            self.output(rank, "stdout", str(text).splitlines())

    def rank_finished(self, outcome: RankOutcome) -> None:
        pass

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        for name in sorted(self._written):
            try:
                self._stream(name).flush()
            except (OSError, ValueError):
                pass
        self._written.clear()

    def tick_in(self) -> float | None:
        return None  # every line is written as it comes

    def tick(self) -> None:
        pass


class CollectingSink:
    """Keeps every line in memory, by rank; for tests and for callers that want the text."""

    lines_in_cell = False

    def __init__(self) -> None:
        self.lines: dict[int, list[tuple[str, str]]] = {}
        self.events: dict[int, list[dict[str, Any]]] = {}
        self.finished: list[RankOutcome] = []
        self.attempts = 0
        self.ranks: list[int] = []  # the ranks the latest launch_started announced

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self.attempts += 1
        self.ranks = list(range(num_processes) if ranks is None else ranks)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        self.lines.setdefault(rank, []).extend((stream, line) for line in lines)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        self.events.setdefault(rank, []).append(event)

    def rank_finished(self, outcome: RankOutcome) -> None:
        self.finished.append(outcome)

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        pass

    def tick_in(self) -> float | None:
        return None

    def tick(self) -> None:
        pass

    def text(self, rank: int, stream: str | None = None) -> list[str]:
        return [line for s, line in self.lines.get(rank, []) if stream is None or s == stream]


class TeeSink:
    """Sends every call to each of ``sinks``, in order; ticks when the soonest of them wants.

    Order matters where one sink reads another's state at ``launch_started`` (the widget view
    names the log files the log sink opened: the log sink comes first).
    """

    def __init__(self, *sinks: Sink) -> None:
        self.sinks = sinks

    @property
    def lines_in_cell(self) -> bool:
        return any(getattr(sink, "lines_in_cell", False) for sink in self.sinks)

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        for sink in self.sinks:
            sink.launch_started(num_processes, attempt, ranks)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        for sink in self.sinks:
            sink.output(rank, stream, lines)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        for sink in self.sinks:
            sink.event(rank, event)

    def rank_finished(self, outcome: RankOutcome) -> None:
        for sink in self.sinks:
            sink.rank_finished(outcome)

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        for sink in self.sinks:
            sink.launch_finished(outcomes)

    def tick_in(self) -> float | None:
        wanted = [due for due in (sink.tick_in() for sink in self.sinks) if due is not None]
        return min(wanted) if wanted else None

    def tick(self) -> None:
        for sink in self.sinks:
            sink.tick()


class ClocklessSink:
    """A sink written against the protocol before it had ``tick_in``/``tick``: it never ticks.

    Example:
        >>> class Old:  # the five calls only
        ...     def launch_started(self, num_processes, attempt, ranks=None): pass
        ...     def output(self, rank, stream, lines): print(rank, lines)
        ...     def event(self, rank, event): pass
        ...     def rank_finished(self, outcome): pass
        ...     def launch_finished(self, outcomes): pass
        >>> sink = ClocklessSink(Old())
        >>> sink.output(0, "stdout", ["hi"]); sink.tick_in()
        0 ['hi']
    """

    CALLS = ("launch_started", "output", "event", "rank_finished", "launch_finished")

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    @property
    def lines_in_cell(self) -> bool:
        return bool(getattr(self.sink, "lines_in_cell", False))

    @classmethod
    def fits(cls, candidate: object) -> bool:
        return all(callable(getattr(candidate, name, None)) for name in cls.CALLS)

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        if ranks is None:
            self.sink.launch_started(num_processes, attempt)  # also fits sinks without ``ranks``
        else:
            self.sink.launch_started(num_processes, attempt, ranks=ranks)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        self.sink.output(rank, stream, lines)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        self.sink.event(rank, event)

    def rank_finished(self, outcome: RankOutcome) -> None:
        self.sink.rank_finished(outcome)

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        self.sink.launch_finished(outcomes)

    def tick_in(self) -> float | None:
        return None

    def tick(self) -> None:
        pass
