"""A view that breaks must not break the launch: the rest of it is shown as text.

``TextFallback`` passes every call to a view (the live widget view); the first call that raises
(a bug, a comm that went away) prints one notice and sends that call and every later one to a
``RichTextSink`` instead, for the rest of the sink's life. Given the view's log files, that text
caps a loud rank's lines as a kernel's text view does (``nbaccel.output.text_cap``).

Example:
    >>> class Broken(CollectingSink):
    ...     def output(self, rank, stream, lines):
    ...         raise RuntimeError("comm gone")
    >>> sink = TextFallback(Broken(), what="the live view")
    >>> sink.lines_in_cell
    False
    >>> sink.output(0, "stdout", ["still shown"])  # doctest: +ELLIPSIS
    nbaccel: the live view failed (RuntimeError: comm gone); the rest of this launch is shown as text. ...
    [rank 0] still shown
    >>> sink.lines_in_cell  # a debugger prompt no longer repeats what pdb printed
    True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nbaccel.launch.notices import say
from nbaccel.launch.outcome import RankOutcome
from nbaccel.output.logdir import RankLogSink
from nbaccel.output.sinks import CollectingSink, Sink  # noqa: F401 - CollectingSink is used by the doctest
from nbaccel.output.text import RichTextSink
from nbaccel.output.text_cap import from_env


class TextFallback:
    """``view`` until one of its calls raises, then text (see the module doc)."""

    def __init__(self, view: Sink, what: str = "the live widget view", logs: RankLogSink | None = None) -> None:
        self.view = view
        self.what = what
        self.logs = logs  # the view's log files: the text caps a loud rank's lines, as in a kernel's text view
        self.text: RichTextSink | None = None  # set once the view has failed

    @property
    def failed(self) -> bool:
        return self.text is not None

    @property
    def lines_in_cell(self) -> bool:
        if self.text is not None:
            return bool(self.text.lines_in_cell)
        return bool(getattr(self.view, "lines_in_cell", False))

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self._call("launch_started", num_processes, attempt, ranks)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        self._call("output", rank, stream, lines)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        self._call("event", rank, event)

    def rank_finished(self, outcome: RankOutcome) -> None:
        self._call("rank_finished", outcome)

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        self._call("launch_finished", outcomes)

    def tick_in(self) -> float | None:
        if self.text is None:
            try:
                return self.view.tick_in()
            except Exception as exc:  # noqa: BLE001 - any bug or comm failure in the view
                self._fall_back(exc)
        return None

    def tick(self) -> None:
        self._call("tick")

    def _call(self, name: str, *args: Any) -> None:
        if self.text is None:
            try:
                getattr(self.view, name)(*args)
                return
            except Exception as exc:  # noqa: BLE001 - any bug or comm failure in the view
                self._fall_back(exc)
        getattr(self.text, name)(*args)

    def _fall_back(self, exc: Exception) -> None:
        if self.logs is None:
            self.text = RichTextSink()
        else:
            max_lines, max_rate = from_env()
            self.text = RichTextSink(max_lines=max_lines, max_rate=max_rate, shared_logs=self.logs)
        say(
            f"{self.what} failed ({type(exc).__name__}: {exc}); the rest of this launch is shown as text. "
            "Please report this; output='text' avoids the widget view."
        )
