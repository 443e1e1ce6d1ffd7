"""RichTextSink: the text view (nbclient, nbconvert, terminals) with rich output as text.

Lines stream live, whole, each labelled with its rank (``TextSink``). On top of that:
``display()`` output shows its ``text/plain``; a progress bar prints a handful of states, never
hundreds of lines: when it first shows, each time it crosses a quarter of its total (at most one
line per ``min_interval`` seconds), every ``quiet_interval`` seconds when its total is unknown,
and its final state when it closes. A bar made with ``leave=False`` (an inner loop's, which
vanishes in a terminal) prints only every ``quiet_interval`` seconds while it lasts.

The launch's closing lines give each sampled rank's figures, as the widget view's last chips do
(``peak_words``): its peak resident memory, the CPU time it had used at its last sample
(about once a second: a rank that ended sooner has no sample, and no line), and on a GPU its
peak device memory.

Given a cap (``max_lines``, ``max_rate``: ``make_sink`` gives one inside a kernel, from
``NBACCEL_TEXT_CAP``, see ``nbaccel.output.text_cap``), every line also goes to the rank's log
file (``nbaccel.output.logdir``, as in the widget view), and a loud rank's lines beyond the cap
stay in its log only: one notice line when the first is held back, and at the end how many were,
with the rank's last lines. A failing rank's traceback and last output come with its error,
never capped.

Example:
    >>> sink = RichTextSink()
    >>> sink.event(1, {"type": "display", "data": {"text/plain": "<Figure size 640x480>"}})
    [rank 1] <Figure size 640x480>
    >>> sink.event(1, {"type": "resources", "cpu": 99.0, "rss": 2**30, "peak_rss": 2**31, "cpu_time": 3.24})
    >>> sink.launch_finished([])
    nbaccel: rank 1: peak 2.0 GiB · cpu 3.2 s
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from nbaccel.launch.outcome import RankOutcome
from nbaccel.output.logdir import DEFAULT_KEEP, RankLogSink, logs_event
from nbaccel.output.resource_words import peak_words
from nbaccel.output.sinks import TextSink
from nbaccel.output.stragglers import wall_straggler
from nbaccel.output.text_cap import DEFAULT_TAIL, LineCap
from nbaccel.wire import rich

_MILESTONES = 4  # a line per quarter of a bar's total


class RichTextSink(TextSink):
    """TextSink plus text renderings of display and progress events, and a cap on loud ranks.

    Args:
        max_lines: each rank's lines written into the cell per launch (None: all).
        max_rate: each rank's lines written per second (None: no limit).
        tail: a rank's last lines held back, shown at the end of the launch.
        log_root: parent folder of the per-launch log folders (default: see ``logdir``), or
            ``True`` for the default; ``None``: logs only when capped; ``False``: none (and no
            cap, since the lines held back would be lost).
        keep_launches: launch folders kept under ``log_root``.
        shared_logs: the log sink of a view this one stands in for (the widget view's, which
            writes every line itself): the cap names its files and writes none of its own.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        stdout: Any = None,
        stderr: Any = None,
        min_interval: float = 1.0,
        quiet_interval: float = 30.0,
        *,
        max_lines: int | None = None,
        max_rate: float | None = None,
        tail: int = DEFAULT_TAIL,
        log_root: Path | str | bool | None = None,
        keep_launches: int = DEFAULT_KEEP,
        shared_logs: RankLogSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(stdout, stderr)
        self.cap = LineCap(max_lines, max_rate, tail, clock)
        self.shared_logs = shared_logs
        wanted = shared_logs is None and (log_root not in (None, False) or (log_root is None and self.cap.limited))
        self.logs = RankLogSink(None if log_root in (None, True) else Path(str(log_root)), keep_launches) if wanted else None
        self._log_start: tuple[int, int, Sequence[int] | None] | None = (0, 0, None)  # launch_started's, until the logs open
        self.min_interval = min_interval
        self.quiet_interval = quiet_interval
        self._bars: dict[tuple[int, int], tuple[float, int]] = {}  # (rank, bar) -> (printed at, milestone)
        self._started_at = time.monotonic()
        self._elapsed: dict[int, float] = {}  # rank -> seconds from the start to its end
        self._figures: dict[int, dict[str, Any]] = {}  # rank -> peak_rss, peak_gpu_mem, cpu_time sampled
        self.closing_figures = True  # False: a worker pool's housekeeping (push, pull, status) ends without them

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self._log_start = (num_processes, attempt, ranks)  # the logs open at the first line
        self.cap.reset()
        self.lines_in_cell = True
        self._bars.clear()
        self._started_at = time.monotonic()
        self._elapsed = {}
        self._figures = {}

    def rank_finished(self, outcome: RankOutcome) -> None:
        self._elapsed[outcome.rank] = time.monotonic() - self._started_at
        if outcome.peak_rss is not None:  # the peak the loop (or the rank's node agent) kept for it
            self._note(outcome.rank, {"peak_rss": outcome.peak_rss})

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        lines = [f"nbaccel: rank {rank}: {peak_words(figures)}" for rank, figures in sorted(self._figures.items())] if self.closing_figures else []
        straggler = wall_straggler(self._elapsed)
        if straggler:
            lines.append(f"nbaccel: {straggler}")
        self._held_back_summary()
        if lines:
            self._stream("stdout").write("".join(f"{line}\n" for line in lines))
            self._written.add("stdout")
        self._figures = {}
        super().launch_finished(outcomes)
        if self.logs is not None and self._log_start is None:
            self.logs.launch_finished(outcomes)
        self._log_start = None  # closed: the next launch_started opens them again

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        if self.logs is not None:
            self._open_logs()
            self.logs.output(rank, stream, lines)
        self._write(rank, stream, lines)

    def _write(self, rank: int, stream: str, lines: list[str]) -> None:
        """``lines`` into the cell, as far as the cap lets them (they are in the log already)."""
        path = self._log_file(rank)
        if path is None or not self.cap.limited:  # no log file to hold lines in: every line goes to the cell
            super().output(rank, stream, lines)
            return
        shown, reason = self.cap.admit(rank, stream, lines)
        if shown == len(lines):
            super().output(rank, stream, lines)
            return
        self.lines_in_cell = False  # a rank's pdb lines may be among those held: its prompt must repeat them
        if shown:
            super().output(rank, stream, lines[:shown])
        if reason is not None:
            self._say(f"nbaccel: rank {rank}: {reason} (every line is in {path})")

    def _held_back_summary(self) -> None:
        """For each rank with lines held back: how many, where they are, and its last ones."""
        for rank in self.cap.held_ranks():
            tail = self.cap.tail(rank)
            shown = f"; its last {len(tail)}:" if tail else ""
            path = self._log_file(rank)
            self._say(
                f"nbaccel: rank {rank}: {self.cap.held(rank):,} of {self.cap.held(rank) + self.cap.shown(rank):,} lines held back from the cell, all in {path}{shown}"
            )
            for stream, line in tail:
                super().output(rank, stream, [line])

    def _open_logs(self) -> None:
        """The launch's log folder, made when its first line comes: a pool's housekeeping (a status,
        a push, every second under ``--watch``) prints nothing, and must not prune real launches' logs."""
        if self._log_start is not None and self.logs is not None:
            self.logs.launch_started(*self._log_start)
            if self.logs.logs is not None:  # a restart's first attempt with lines: files of its attempt
                self.logs.logs.attempt = self._log_start[1]
            self._log_start = None

    def _log_file(self, rank: int) -> Path | None:
        logs = self.logs or self.shared_logs
        return logs.file_for(rank) if logs is not None else None

    def _say(self, line: str) -> None:
        self._stream("stdout").write(f"{line}\n")
        self._written.add("stdout")

    def _note(self, rank: int, sample: dict[str, Any]) -> None:
        """Keep ``rank``'s peaks (the most seen) and its latest CPU time from a sample."""
        figures = self._figures.setdefault(rank, {})
        for peak in ("peak_rss", "peak_gpu_mem"):
            if sample.get(peak) is not None:
                figures[peak] = max(int(sample[peak]), figures.get(peak) or 0)
        if sample.get("cpu_time") is not None:
            figures["cpu_time"] = float(sample["cpu_time"])

    def event(self, rank: int, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if self.logs is not None and logs_event(event):  # a rank's start, a stack: nothing to log, no folder
            self._open_logs()
            self.logs.event(rank, event)
        if kind == rich.RESOURCES:
            self._note(rank, event)
            return
        if kind == rich.PROGRESS:
            if self._should_print(rank, event):
                self._write(rank, "stdout", [str(event.get("text", ""))])
            return
        text = rich.plain_text(event)
        if text:
            self._write(rank, "stdout", text.splitlines())  # the log sink logged the display's text

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
