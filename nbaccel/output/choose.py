"""Choose the sink for a launch from the ``output`` argument and ``NBACCEL_OUTPUT``.

``"widgets"``: the live per-rank widget view (``WidgetSink``); ``"text"``: labelled lines
(``RichTextSink``); ``"auto"`` (the default): widgets when a frontend that renders them runs
this kernel, text otherwise (nbclient, nbconvert, terminal IPython, plain Python); see
``nbaccel.output.frontend`` for how that is told.

Example:
    >>> type(make_sink("text")).__name__
    'RichTextSink'
"""

from __future__ import annotations

import os
import sys

from nbaccel.output import frontend
from nbaccel.output.text import RichTextSink
from nbaccel.output.sinks import Sink

OUTPUT_MODES = ("auto", "text", "widgets")
ENV_VAR = "NBACCEL_OUTPUT"

_warned = {"no_kernel": False}


def make_sink(output: str | Sink | None) -> Sink:
    if output is not None and not isinstance(output, str):
        if isinstance(output, Sink):
            return output
        raise TypeError(f"output must be one of {OUTPUT_MODES!r} or a Sink, got {type(output).__name__}.")
    mode = output or os.environ.get(ENV_VAR) or "auto"
    if mode not in OUTPUT_MODES:
        source = "output" if output else ENV_VAR
        raise ValueError(f"unknown {source} {mode!r}; choose one of {', '.join(map(repr, OUTPUT_MODES))}.")
    if mode == "text":
        return RichTextSink()
    if mode == "widgets":
        if frontend.in_kernel():
            return _widget_sink()
        _warn_no_kernel()
        return RichTextSink()
    return _widget_sink() if frontend.widget_frontend_attached() else RichTextSink()


def _widget_sink() -> Sink:
    from nbaccel.output.widgets.sink import WidgetSink  # imports ipywidgets: only where widgets are wanted

    return WidgetSink(ticker=False)  # the kernel's event loop (nbaccel.launch.loop) drives its ticks


def _warn_no_kernel() -> None:
    if not _warned["no_kernel"]:
        _warned["no_kernel"] = True
        print(
            "nbaccel: output='widgets' needs a Jupyter kernel (this is plain Python or a terminal); "
            "showing text instead. Use output='text' (or NBACCEL_OUTPUT=text) to silence this.",
            file=sys.stderr,
        )


frontend.watch()  # from the first launch on, notice widget frontends that (re)connect
