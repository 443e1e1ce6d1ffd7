"""Choose the sink for a launch from the ``output`` argument and ``NBACCEL_OUTPUT``.

``"widgets"``: the live per-rank widget view (``WidgetSink``); ``"text"``: labelled lines
(``RichTextSink``; inside a kernel with every line in the ranks' log files too, and a loud rank's
lines in the cell capped: ``text_sink``); ``"auto"`` (the default): widgets when a frontend that renders them runs
this kernel, text otherwise (nbclient, papermill, nbconvert, terminal IPython, plain Python, a
frontend nbaccel does not recognise); see ``nbaccel.output.frontend`` for how that is told.
The widget view keeps the pace of the frontend it found (``nbaccel.output.update_policy``: about
10 widget messages a second in VS Code and Colab), whichever way widgets were chosen. A launch
run from another thread than the kernel's main one gets text: widget updates from a thread are
not rendered everywhere (Colab, colabtools #3373).

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
import threading
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
from nbaccel.output.text_cap import from_env
from nbaccel.output.update_policy import UpdatePolicy, policy_for

if TYPE_CHECKING:
    from nbaccel.output.widgets.sink import Publisher

OUTPUT_MODES = ("auto", "text", "widgets")
ENV_VAR = "NBACCEL_OUTPUT"

_warned = {"no_kernel": False, "thread": False}


class WidgetSink(TeeSink):
    """The widget view of a launch: the ranks' log files, then the live view (text if it breaks).

    Args:
        max_lines: lines each rank's panel keeps in the browser (older ones stay in the log;
            default: the frontend's, 500 in JupyterLab, 200 in VS Code and Colab).
        max_displays: rich outputs (figures, tables) each panel keeps.
        interval: least seconds between two pushes of one rank's panel (default: the frontend's).
        log_root: parent folder of the per-launch log folders (default: see ``logdir``);
            ``False`` keeps no logs.
        keep_launches: launch folders kept under ``log_root``.
        publisher: where the view is displayed (default: IPython's display, into the cell).
        clock: seconds, monotonic (``time.monotonic``; tests pass a fake one).
        policy: the frontend's pace (default: that of the frontend running this cell, see
            ``nbaccel.output.frontend.detect``).
    """

    def __init__(
        self,
        max_lines: int | None = None,
        max_displays: int = 20,
        interval: float | None = None,
        log_root: Path | str | bool | None = None,
        keep_launches: int = DEFAULT_KEEP,
        publisher: Publisher | None = None,
        clock: Callable[[], float] = time.monotonic,
        policy: UpdatePolicy | None = None,
    ) -> None:
        from nbaccel.output.widgets.sink import LiveViewSink  # imports ipywidgets: only where widgets are wanted

        self.policy = policy or policy_for(frontend.detect().name)
        self.logs = None if log_root is False else RankLogSink(None if log_root in (None, True) else Path(str(log_root)), keep_launches)
        self.live = LiveViewSink(max_lines, max_displays, interval, publisher, logs=self.logs, clock=clock, policy=self.policy)
        self.fallback = TextFallback(self.live, what="the live widget view", logs=self.logs)
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
        return text_sink()
    if threading.current_thread() is not threading.main_thread():
        if mode == "widgets":
            _warn_once(
                "thread",
                "output='widgets' from a thread other than the kernel's main one: showing text (widget updates from a thread are not rendered everywhere).",
            )
        return text_sink()
    if mode == "widgets":
        if frontend.in_kernel():
            return WidgetSink()
        _warn_no_kernel()
        return text_sink()
    found = frontend.detect()
    return WidgetSink(policy=policy_for(found.name)) if found.widgets else text_sink()


def text_sink() -> RichTextSink:
    """The text view: in a kernel (its lines saved in the notebook), every line also in the ranks'
    log files and a loud rank's lines capped (``NBACCEL_TEXT_CAP``, see ``nbaccel.output.text_cap``);
    in a terminal or plain Python, every line to the terminal, as a script's output goes.

    >>> text_sink().logs is None  # no kernel runs this doctest
    True
    """
    if not frontend.in_kernel():
        return RichTextSink()
    max_lines, max_rate = from_env()
    return RichTextSink(max_lines=max_lines, max_rate=max_rate, log_root=True)


def _warn_once(key: str, text: str) -> None:
    if not _warned[key]:
        _warned[key] = True
        say(text)


def _warn_no_kernel() -> None:
    if not _warned["no_kernel"]:
        _warned["no_kernel"] = True
        say(
            "output='widgets' needs a Jupyter kernel (this is plain Python or a terminal); "
            "showing text instead. Use output='text' (or NBACCEL_OUTPUT=text) to silence this."
        )


frontend.watch()  # from the first launch on, notice widget frontends that (re)connect
