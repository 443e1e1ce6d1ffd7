"""Where relayed output goes. A Sink receives whole lines and events per rank, in the kernel.

Sinks are called from the kernel's main thread (the cell that launched), so they may print into
the cell or update widgets directly.

Example:
    >>> sink = TextSink()
    >>> sink.output(1, "stdout", ["loss 0.25"])  # prints "[rank 1] loss 0.25"
    [rank 1] loss 0.25
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from nbaccel.launch.outcome import RankOutcome


@runtime_checkable
class Sink(Protocol):
    """The interface every output destination implements (text, widgets, log files)."""

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        """A (re)launch of ``num_processes`` ranks begins; ``attempt`` counts from 0.

        ``ranks`` lists the ranks taking part, when not all of them (default: every rank in
        ``range(num_processes)``): a cell on persistent workers run with ``--ranks 1,3``
        announces ``launch_started(4, 0, ranks=[1, 3])``, and only those ranks will finish.
        """

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        """Whole lines (no trailing newline) that ``rank`` wrote to ``stream`` ("stdout"/"stderr")."""

    def event(self, rank: int, event: dict[str, Any]) -> None:
        """Rich output from ``rank``: display data, progress bars (see nbaccel.wire.events)."""

    def rank_finished(self, outcome: RankOutcome) -> None:
        """``outcome.rank`` has ended (succeeded, failed, stopped ...)."""

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        """Every rank has ended; flush whatever is buffered."""


class TextSink:
    """Prints each line into the cell labelled with its rank: ``[rank 1] ...``.

    stdout lines go to ``sys.stdout`` and stderr lines to ``sys.stderr`` (so notebooks show
    them as they show any stderr). Used headless, under nbclient, and with ``--text``.
    """

    def __init__(self, stdout: Any = None, stderr: Any = None) -> None:
        self._stdout = stdout
        self._stderr = stderr
        self._written: set[str] = set()  # streams to flush at the end (a flush blocks in a kernel)

    def _stream(self, name: str) -> Any:
        # Resolved per call: inside a kernel sys.stdout is replaced per cell.
        if name == "stderr":
            return self._stderr or sys.stderr
        return self._stdout or sys.stdout

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        pass

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        prefix = f"[rank {rank}] "
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


class CollectingSink:
    """Keeps every line in memory, by rank; for tests and for callers that want the text."""

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

    def text(self, rank: int, stream: str | None = None) -> list[str]:
        return [line for s, line in self.lines.get(rank, []) if stream is None or s == stream]
