"""Choose the sink for a launch from the ``output`` argument and ``NBACCEL_OUTPUT``.

Example:
    >>> type(make_sink("text")).__name__
    'TextSink'
"""

from __future__ import annotations

import os

from .sinks import Sink, TextSink

OUTPUT_MODES = ("auto", "text", "widgets")
ENV_VAR = "NBACCEL_OUTPUT"


def make_sink(output: str | Sink | None) -> Sink:
    if output is not None and not isinstance(output, str):
        if isinstance(output, Sink):
            return output
        raise TypeError(f"output must be one of {OUTPUT_MODES!r} or a Sink, got {type(output).__name__}.")
    mode = output or os.environ.get(ENV_VAR) or "auto"
    if mode not in OUTPUT_MODES:
        source = "output" if output else ENV_VAR
        raise ValueError(f"unknown {source} {mode!r}; choose one of {', '.join(map(repr, OUTPUT_MODES))}.")
    return TextSink()
