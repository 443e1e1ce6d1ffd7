"""A per-rank timeline of a profiled launch as an SVG picture: compute and collectives, one bar per rank.

Drawn by hand, not with matplotlib: no import of seconds in the kernel, no change to its plotting
state (a notebook's backend stays as it was), no font files held open, and a picture every
frontend that renders HTML shows. Spans are drawn on a pixel grid: what falls in one pixel column
is one rectangle, so a trace of a million spans is still a picture of at most ``WIDTH`` columns
per rank and kind.

Example:
    >>> from nbaccel.output.profile_summary import RankProfile
    >>> svg = timeline_svg([RankProfile(0, 1.0, 0.5, 0.2, compute_spans=[(0, 5 * 10**8)], collective_spans=[(6 * 10**8, 8 * 10**8)])], start_ns=0)
    >>> svg.startswith("<svg") and svg.count("<rect") == 2 + 2  # two bars and the legend's two swatches
    True
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from nbaccel.output.profile_summary import RankProfile, Span

WIDTH = 720  # pixels of the time axis
_LABEL, _ROW, _TOP, _AXIS = 60, 22, 20, 24  # label column, row height, legend band, axis band
_COLOURS = {"compute": "#1a73e8", "collectives": "#f9ab00"}


def timeline_svg(profiles: Sequence[RankProfile], start_ns: int) -> str:
    """The picture, time in seconds from ``start_ns`` to the last span's end."""
    ranks = sorted(profiles, key=lambda p: p.rank)
    end_ns = max([start_ns + 1] + [e for p in ranks for _, e in p.compute_spans + p.collective_spans])
    scale = WIDTH / (end_ns - start_ns)
    height = _TOP + _ROW * len(ranks) + _AXIS
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{_LABEL + WIDTH + 10}' height='{height}' font-family='sans-serif' font-size='11'>"]
    parts += _legend()
    for row, profile in enumerate(ranks):
        y = _TOP + row * _ROW
        parts.append(f"<text x='4' y='{y + 15}'>rank {profile.rank}</text>")
        for kind, spans in (("compute", profile.compute_spans), ("collectives", profile.collective_spans)):
            for first, last in _columns(spans, start_ns, scale):
                parts.append(f"<rect x='{_LABEL + first}' y='{y + 3}' width='{last - first + 1}' height='{_ROW - 6}' fill='{_COLOURS[kind]}'/>")
    parts += _axis(_TOP + _ROW * len(ranks), (end_ns - start_ns) / 1e9)
    parts.append("</svg>")
    return "".join(parts)


def _columns(spans: list[Span], start_ns: int, scale: float) -> list[tuple[int, int]]:
    """The pixel columns ``spans`` cover, as runs (first, last) of adjacent columns."""
    runs: list[tuple[int, int]] = []
    for start, end in spans:
        first = int((start - start_ns) * scale)
        last = max(first, min(WIDTH - 1, int((end - start_ns) * scale)))
        if runs and first <= runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], max(runs[-1][1], last))
        else:
            runs.append((first, last))
    return runs


def _legend() -> list[str]:
    parts = []
    for i, (kind, colour) in enumerate(_COLOURS.items()):
        x = _LABEL + i * 110
        parts.append(f"<rect x='{x}' y='4' width='10' height='10' fill='{colour}'/><text x='{x + 14}' y='13'>{html.escape(kind)}</text>")
    return parts


def _axis(y: float, seconds: float) -> list[str]:
    parts = [f"<line x1='{_LABEL}' y1='{y}' x2='{_LABEL + WIDTH}' y2='{y}' stroke='#5f6368'/>"]
    for i in range(5):
        x = _LABEL + WIDTH * i / 4
        parts.append(f"<text x='{x}' y='{y + 16}' text-anchor='middle' fill='#5f6368'>{seconds * i / 4:.2f} s</text>")
    return parts
