"""RichTextSink: the text view (nbclient, nbconvert, terminals) with rich output as text.

Lines stream live, whole, each labelled with its rank (``TextSink``). On top of that:
``display()`` output shows its ``text/plain``; a progress bar prints a handful of states, never
hundreds of lines: when it first shows, each time it crosses a quarter of its total (at most one
line per ``min_interval`` seconds), every ``quiet_interval`` seconds when its total is unknown,
and its final state when it closes. A bar made with ``leave=False`` (an inner loop's, which
vanishes in a terminal) prints only every ``quiet_interval`` seconds while it lasts.

Example:
    >>> sink = RichTextSink()
    >>> sink.event(1, {"type": "display", "data": {"text/plain": "<Figure size 640x480>"}})
    [rank 1] <Figure size 640x480>
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from nbaccel.launch.outcome import RankOutcome
from nbaccel.output.sinks import TextSink
from nbaccel.output.stragglers import wall_straggler
from nbaccel.wire import rich

_MILESTONES = 4  # a line per quarter of a bar's total


class RichTextSink(TextSink):
    """TextSink plus text renderings of display and progress events."""

    def __init__(self, stdout: Any = None, stderr: Any = None, min_interval: float = 1.0, quiet_interval: float = 30.0) -> None:
        super().__init__(stdout, stderr)
        self.min_interval = min_interval
        self.quiet_interval = quiet_interval
        self._bars: dict[tuple[int, int], tuple[float, int]] = {}  # (rank, bar) -> (printed at, milestone)
        self._started_at = time.monotonic()
        self._elapsed: dict[int, float] = {}  # rank -> seconds from the start to its end

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self._bars.clear()
        self._started_at = time.monotonic()
        self._elapsed = {}

    def rank_finished(self, outcome: RankOutcome) -> None:
        self._elapsed[outcome.rank] = time.monotonic() - self._started_at

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        straggler = wall_straggler(self._elapsed)
        if straggler:
            self._stream("stdout").write(f"nbaccel: {straggler}\n")
            self._written.add("stdout")
        super().launch_finished(outcomes)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == rich.PROGRESS:
            if self._should_print(rank, event):
                self.output(rank, "stdout", [str(event.get("text", ""))])
            return
        text = rich.plain_text(event)
        if text:
            self.output(rank, "stdout", text.splitlines())

    def _should_print(self, rank: int, event: dict[str, Any]) -> bool:
        key = (rank, int(event.get("bar", 0)))
        now = time.monotonic()
        fraction = rich.progress_fraction(event)
        milestone = int(fraction * _MILESTONES) if fraction is not None else 0
        seen = self._bars.get(key)
        if event.get("closed"):
            self._bars.pop(key, None)
            return bool(event.get("leave", True))
        leave = bool(event.get("leave", True))
        if seen is None:
            self._bars[key] = (now, milestone)
            return leave  # a bar that will vanish (an inner loop's) prints only if it lasts
        printed_at, last_milestone = seen
        if fraction is None or not leave:  # noqa: SIM108 - two rules, each read on its own line
            due = now - printed_at >= self.quiet_interval
        else:
            due = milestone > last_milestone and now - printed_at >= self.min_interval
        if due:
            self._bars[key] = (now, milestone)
        return due
