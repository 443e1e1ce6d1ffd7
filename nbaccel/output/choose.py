"""Choose the sink for a launch from the ``output`` argument and ``NBACCEL_OUTPUT``.

``"widgets"``: the live per-rank widget view (``WidgetSink``); ``"text"``: labelled lines
(``RichTextSink``); ``"auto"`` (the default): widgets when a frontend that renders them runs
this kernel, text otherwise (nbclient, nbconvert, terminal IPython, plain Python); see
``nbaccel.output.frontend`` for how that is told.

``WidgetSink`` is three sinks side by side: every rank's full log (``RankLogSink``), and the
live widget view (``LiveViewSink``), shown as text instead if it breaks (``TextFallback``).

Example:
    >>> type(make_sink("text")).__name__
    'RichTextSink'
    >>> make_sink(CollectingSink()).tick_in() is None  # a Sink is used as it is
    True

    In a notebook, ``notebook_launcher(train, num_processes=4, output=WidgetSink(max_lines=2000))``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nbaccel.launch.notices import say
from nbaccel.output import frontend
from nbaccel.output.fallback import TextFallback
from nbaccel.output.logdir import DEFAULT_KEEP, RankLogSink
from nbaccel.output.sinks import ClocklessSink, CollectingSink, LinePrefix, Sink, TeeSink, TextSink  # noqa: F401 - CollectingSink is used by the doctest
from nbaccel.output.text import RichTextSink

if TYPE_CHECKING:
    from nbaccel.output.widgets.sink import Publisher

OUTPUT_MODES = ("auto", "text", "widgets")
ENV_VAR = "NBACCEL_OUTPUT"

_warned = {"no_kernel": False}


class WidgetSink(TeeSink):
    """The widget view of a launch: the ranks' log files, then the live view (text if it breaks).

    Args:
        max_lines: lines each rank's panel keeps in the browser (older ones stay in the log).
        max_displays: rich outputs (figures, tables) each panel keeps.
        interval: least seconds between two pushes of one rank's panel.
        log_root: parent folder of the per-launch log folders (default: see ``logdir``);
            ``False`` keeps no logs.
        keep_launches: launch folders kept under ``log_root``.
        publisher: where the view is displayed (default: IPython's display, into the cell).
        clock: seconds, monotonic (``time.monotonic``; tests pass a fake one).
    """

    def __init__(
        self,
        max_lines: int = 500,
        max_displays: int = 20,
        interval: float = 0.05,
        log_root: Path | str | bool | None = None,
        keep_launches: int = DEFAULT_KEEP,
        publisher: Publisher | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from nbaccel.output.widgets.sink import LiveViewSink  # imports ipywidgets: only where widgets are wanted

        self.logs = None if log_root is False else RankLogSink(None if log_root in (None, True) else Path(str(log_root)), keep_launches)
        self.live = LiveViewSink(max_lines, max_displays, interval, publisher, logs=self.logs, clock=clock)
        self.fallback = TextFallback(self.live, what="the live widget view")
        super().__init__(*([self.logs] if self.logs is not None else []), self.fallback)


def make_sink(output: str | Sink | None, prefix: LinePrefix | None = None) -> Sink:
    """The sink for ``output``; ``prefix`` labels each line of a text view (the widget view keeps its layout)."""
    sink = _make_sink(output)
    if prefix is not None and isinstance(sink, TextSink):
        sink.prefix = prefix
    return sink


def _make_sink(output: str | Sink | None) -> Sink:
    if output is not None and not isinstance(output, str):
        if isinstance(output, Sink):
            return output
        if ClocklessSink.fits(output):
            return ClocklessSink(output)
        raise TypeError(f"output must be one of {OUTPUT_MODES!r} or a Sink, got {type(output).__name__}.")
    mode = output or os.environ.get(ENV_VAR) or "auto"
    if mode not in OUTPUT_MODES:
        source = "output" if output else ENV_VAR
        raise ValueError(f"unknown {source} {mode!r}; choose one of {', '.join(map(repr, OUTPUT_MODES))}.")
    if mode == "text":
        return RichTextSink()
    if mode == "widgets":
        if frontend.in_kernel():
            return WidgetSink()
        _warn_no_kernel()
        return RichTextSink()
    return WidgetSink() if frontend.widget_frontend_attached() else RichTextSink()


def _warn_no_kernel() -> None:
    if not _warned["no_kernel"]:
        _warned["no_kernel"] = True
        say(
            "output='widgets' needs a Jupyter kernel (this is plain Python or a terminal); "
            "showing text instead. Use output='text' (or NBACCEL_OUTPUT=text) to silence this."
        )


frontend.watch()  # from the first launch on, notice widget frontends that (re)connect
