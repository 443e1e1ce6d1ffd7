"""A per-rank timeline of a profiled launch as a PNG: compute and collectives, one bar per rank.

Drawn with matplotlib's Agg backend (no display needed, the kernel's own backend untouched);
None when matplotlib is not installed: the summary's table and words still show.

Example:
    >>> from nbaccel.output.profile_summary import RankProfile
    >>> png = timeline_png([RankProfile(0, 1.0, 0.5, 0.2, compute_spans=[(0, 5 * 10**8)], collective_spans=[(6 * 10**8, 8 * 10**8)])], start_ns=0)
    >>> png is None or png[:8] == b"\\x89PNG\\r\\n\\x1a\\n"
    True
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from nbaccel.output.profile_summary import RankProfile, Span

_COLOURS = {"compute": "#1a73e8", "collectives": "#f9ab00"}
_MAX_BARS = 4000  # spans per rank and kind drawn; beyond, neighbours are joined (a picture, not data)


def timeline_png(profiles: Sequence[RankProfile], start_ns: int) -> bytes | None:
    """The picture's PNG bytes, time in seconds from ``start_ns``."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return None
    figure = Figure(figsize=(8, 0.5 + 0.45 * len(profiles)), dpi=100)
    axes = figure.subplots()
    for row, profile in enumerate(sorted(profiles, key=lambda p: p.rank)):
        for kind, spans in (("compute", profile.compute_spans), ("collectives", profile.collective_spans)):
            bars = [((s - start_ns) / 1e9, (e - s) / 1e9) for s, e in _coarse(spans)]
            axes.broken_barh(bars, (row - 0.35, 0.7), color=_COLOURS[kind], label=kind if row == 0 else None)
    axes.set_yticks(range(len(profiles)), [f"rank {p.rank}" for p in sorted(profiles, key=lambda p: p.rank)])
    axes.invert_yaxis()
    axes.set_xlabel("seconds")
    axes.legend(loc="upper right", fontsize="small", ncols=2)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    _close_fonts()
    return buffer.getvalue()


def _close_fonts() -> None:
    """Drop matplotlib's cache of open font files: the kernel keeps no fds for one picture."""
    from matplotlib import font_manager

    clear = getattr(getattr(font_manager, "_get_font", None), "cache_clear", None)
    if clear is not None:
        clear()


def _coarse(spans: list[Span]) -> list[Span]:
    if len(spans) <= _MAX_BARS:
        return spans
    step = len(spans) // _MAX_BARS + 1
    return [(spans[i][0], spans[min(i + step, len(spans)) - 1][1]) for i in range(0, len(spans), step)]
