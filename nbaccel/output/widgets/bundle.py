"""The per-rank bundle a finished launch saves for nbaccel's JupyterLab extension (schema v1).

The static view (``static_view``) carries it under ``RANKS_MIME`` beside its text/html and
text/plain fallbacks: JupyterLab with the extension renders it as rank tabs (the live view's
look, rich outputs included); every other reader ignores it. nbformat stores MIME types that
end in ``json`` as JSON objects, so the saved notebook holds plain data. Schema: docs/extension.md.

Pure Python over what the view already holds; nothing here touches widgets or the kernel.

Example:
    >>> from nbaccel.output.widgets.live_view import LaunchView
    >>> view = LaunchView(num_processes=2)
    >>> view.panels[0].add_lines("stdout", ["hello"])
    >>> bundle = ranks_bundle(view, "done in 1.2 s")
    >>> bundle["version"], bundle["title"], [r["rank"] for r in bundle["ranks"]]
    (1, '2 ranks', [0, 1])
    >>> bundle["ranks"][0]["outputs"]
    [{'output_type': 'stream', 'name': 'stdout', 'text': 'hello\\n'}]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbaccel.launch.outcome import RankOutcome, Status
from nbaccel.output.status_words import RankState, elapsed_words
from nbaccel.output.widgets.live_view import LaunchView, ranks_words
from nbaccel.output.widgets.rank_panel import RankPanel, failure_outputs

RANKS_MIME = "application/vnd.nbaccel.ranks+json"
SCHEMA_VERSION = 1


def ranks_bundle(
    view: LaunchView,
    summary: str,
    elapsed: Mapping[int, float] | None = None,
    nodes: Mapping[int, str] | None = None,
) -> dict[str, Any]:
    """The bundle of ``view`` (every rank taking part, and any that printed), lowest rank first.

    ``summary`` says how the launch ended ("failed after 2.0 s"); ``elapsed`` (seconds) and
    ``nodes`` (host names, only worth giving when there are several) are per rank where known.
    """
    elapsed, nodes = elapsed or {}, nodes or {}
    return {
        "version": SCHEMA_VERSION,
        "title": ranks_words(view.ranks, view.num_processes),
        "summary": summary,
        "num_processes": view.num_processes,
        "attempt": view.attempt,
        "log_dir": view.log_dir,
        "ranks": [
            {
                **rank_entry(rank, view.states[rank], panel, elapsed.get(rank), nodes.get(rank)),
                "peak_rss": view.peaks.get(rank),
                "peak_gpu_mem": view.gpu_peaks.get(rank),
            }
            for rank, panel in sorted(view.panels.items())
        ],
    }


def rank_entry(rank: int, state: RankState, panel: RankPanel, elapsed: float | None = None, node: str | None = None) -> dict[str, Any]:
    """One rank: its status in words, its failure first, its outputs in order, what was dropped."""
    failure = failure_outputs(panel.failure)[0] if panel.failure is not None else None
    return {
        "rank": rank,
        "status": status_entry(state, panel.failure),
        "elapsed": None if elapsed is None else round(float(elapsed), 3),
        "elapsed_words": None if elapsed is None else elapsed_words(elapsed),  # the kernel's words: the extension shows them
        "node": node,
        "failure": failure,
        "progress": [str(bar.state.get("text", "")) for bar in panel.bars.values()],
        "outputs": [_plain_output(output) for block in panel.blocks for output in block.outputs],
        "dropped_lines": panel.dropped_lines,
        "dropped_displays": panel.dropped_displays,
        "log_path": panel.log_file,
    }


def status_entry(state: RankState, outcome: RankOutcome | None = None) -> dict[str, Any]:
    """The status words and symbol (as the chips and tabs say them) and, for a failure, what it was.

    Example:
        >>> from nbaccel.output.status_words import rank_state
        >>> killed = RankOutcome(rank=1, status=Status.SIGNALED, signal=9)
        >>> status_entry(rank_state(killed), killed)
        {'kind': 'failed', 'symbol': '✗', 'short': 'failed (SIGKILL)', 'long': 'failed: killed by SIGKILL', 'exception': None, 'exit_code': None, 'signal': 'SIGKILL'}
    """
    entry: dict[str, Any] = {"kind": state.kind, "symbol": state.symbol, "short": state.short, "long": state.long}
    if outcome is not None:
        error = outcome.error if outcome.status is Status.FAILED else None
        entry["exception"] = error.type_name if error is not None else None
        entry["exit_code"] = outcome.exitcode if outcome.exitcode not in (None, 0) else None
        entry["signal"] = outcome.signal_name
    return entry


def _plain_output(output: dict[str, Any]) -> dict[str, Any]:
    """A copy that is plain JSON (the panel's stream dicts keep growing in place)."""
    plain = dict(output)
    if "data" in plain:
        plain["data"] = dict(plain["data"])
        plain["metadata"] = dict(plain.get("metadata") or {})
    return plain
