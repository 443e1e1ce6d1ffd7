"""The static view of a finished launch: HTML and plain text, every rank shown, the lowest first.

At the end of a launch the widget's display is replaced by this bundle, so the saved notebook
holds what happened in a form every reader renders (JupyterLab reopened without a kernel,
nbconvert, GitHub, nbclient), with no widget state needed. The lowest rank (rank 0, unless a
cell ran on some ranks only) and every failed rank are open; the others are one click away
(``<details>``), each with its status in words.

Example:
    >>> view = LaunchView(num_processes=2)
    >>> view.panels[0].add_lines("stdout", ["hello"])
    >>> bundle = static_bundle(view, "done in 1.2 s")
    >>> print(bundle["text/plain"].splitlines()[0])
    nbaccel: 2 ranks, done in 1.2 s
    >>> print(static_bundle(LaunchView(num_processes=4, ranks=[1, 3]), "done in 1 s")["text/plain"])
    nbaccel: ranks 1, 3 of 4, done in 1 s
    ── rank 1 · waiting ──
    (no output)
    ── rank 3 · waiting ──
    (no output)
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

from nbaccel.output.widgets.bundle import RANKS_MIME, ranks_bundle
from nbaccel.output.widgets.live_view import LaunchView, chip_html, ranks_words, tab_title
from nbaccel.output.widgets.rank_panel import RankPanel, failure_outputs

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
_IMAGE_MIMES = ("image/png", "image/jpeg", "image/gif")


def static_bundle(view: LaunchView, summary: str, elapsed: Mapping[int, float] | None = None, nodes: Mapping[int, str] | None = None) -> dict[str, Any]:
    """``{"text/html": ..., "text/plain": ..., RANKS_MIME: ...}`` for ``view``; ``summary`` says how it ended.

    The per-rank JSON (``bundle.RANKS_MIME``, with each rank's ``elapsed`` seconds where known) is
    for nbaccel's JupyterLab extension (rank tabs);
    readers without it show the html or the text.
    """
    return {RANKS_MIME: ranks_bundle(view, summary, elapsed, nodes), "text/html": render_html(view, summary), "text/plain": render_text(view, summary)}


def render_text(view: LaunchView, summary: str) -> str:
    ranks = ranks_words(view.ranks, view.num_processes)
    attempt = f" (attempt {view.attempt + 1})" if view.attempt else ""
    lines = [f"nbaccel: {ranks}{attempt}, {summary}"]
    if view.log_dir:
        lines.append(f"full logs: {view.log_dir}")
    for rank, panel in view.panels.items():
        use = f" · {view.resources[rank]}" if rank in view.resources else ""
        lines.append(f"── {tab_title(rank, view.states[rank])}{use} ──")
        lines.extend(_panel_text(panel))
    return "\n".join(lines)


def render_html(view: LaunchView, summary: str) -> str:
    ranks = ranks_words(view.ranks, view.num_processes)
    first = view.ranks[0] if view.ranks else None  # open, as the live view's first tab was selected
    attempt = f" · attempt {view.attempt + 1}" if view.attempt else ""
    logs = f"<div style='color:#5f6368;font-size:11px'>full logs: <code>{html.escape(view.log_dir)}</code></div>" if view.log_dir else ""
    parts = [
        "<div class='nbaccel-launch-static'>",
        f"<div><b>nbaccel</b> <span style='color:#5f6368'>{ranks}{attempt} · {html.escape(summary)}</span></div>{logs}",
        "<div>" + "".join(chip_html(rank, state, view.resources.get(rank)) for rank, state in view.states.items()) + "</div>",
    ]
    for rank, panel in view.panels.items():
        state = view.states[rank]
        is_open = " open" if rank == first or state.is_failure else ""
        title = html.escape(tab_title(rank, state))
        marker = "✗ " if state.is_failure else ""
        parts.append(f"<details{is_open}><summary><b>{marker}{title}</b></summary>")
        parts.extend(_panel_html(panel))
        parts.append("</details>")
    parts.append("</div>")
    return "\n".join(parts)


def _panel_text(panel: RankPanel) -> list[str]:
    lines = []
    if panel.failure is not None:
        lines.extend(_outputs_text(failure_outputs(panel.failure)))
    lines.extend(str(bar.state.get("text", "")) for bar in panel.bars.values())
    if panel.dropped_lines or panel.dropped_displays:
        lines.append(_dropped_words(panel))
    for block in panel.blocks:
        lines.extend(_outputs_text(block.outputs))
    if len(lines) == 0:
        lines.append("(no output)")
    return [_ANSI.sub("", line) for line in lines]


def _panel_html(panel: RankPanel) -> list[str]:
    parts = []
    if panel.failure is not None:
        text = "\n".join(_outputs_text(failure_outputs(panel.failure)))
        parts.append(_pre(text, "background:#fce8e6;color:#a50e0e"))
    if panel.bars:
        parts.append(_pre("\n".join(str(b.state.get("text", "")) for b in panel.bars.values()), ""))
    if panel.dropped_lines or panel.dropped_displays:
        parts.append(f"<div style='color:#5f6368;font-size:12px'>{html.escape(_dropped_words(panel))}</div>")
    for block in panel.blocks:
        parts.extend(_output_html(output) for output in block.outputs)
    if not parts:
        parts.append("<div style='color:#5f6368'>(no output)</div>")
    return parts


def _dropped_words(panel: RankPanel) -> str:
    where = f"; the full log is in {panel.log_file}" if panel.log_file else ""
    return f"… {panel.dropped_words()} not shown{where}"


def _outputs_text(outputs: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            lines.extend(output["text"].rstrip("\n").split("\n"))
        elif kind == "error":
            lines.extend(output.get("traceback", []))
        else:
            data = output.get("data", {})
            lines.extend(str(data.get("text/plain", "[" + ", ".join(sorted(data)) + "]")).splitlines())
    return [_ANSI.sub("", line) for line in lines]


def _output_html(output: dict[str, Any]) -> str:
    kind = output.get("output_type")
    if kind == "stream":
        style = "background:#fdf3f2" if output.get("name") == "stderr" else ""
        return _pre(output["text"].rstrip("\n"), style)
    if kind == "error":
        return _pre("\n".join(output.get("traceback", [])), "background:#fce8e6;color:#a50e0e")
    data = output.get("data", {})
    if "text/html" in data:
        return f"<div>{_joined(data['text/html'])}</div>"
    for mime in _IMAGE_MIMES:
        if mime in data:
            return f"<img src='data:{mime};base64,{_joined(data[mime]).strip()}' style='max-width:100%'/>"
    if "image/svg+xml" in data:
        return f"<div>{_joined(data['image/svg+xml'])}</div>"
    return _pre(str(data.get("text/plain", "")), "")


def _pre(text: str, style: str) -> str:
    clean = html.escape(_ANSI.sub("", text))
    return f"<pre style='margin:0;padding:1px 4px;white-space:pre-wrap;{style}'>{clean}</pre>"


def _joined(value: Any) -> str:
    """Mimebundle values may be lists of strings (nbformat's multiline form)."""
    return "".join(value) if isinstance(value, list) else str(value)
