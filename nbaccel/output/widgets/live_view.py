"""The widget of one launch: a header (a status chip per rank, the elapsed time) above one tab
per rank taking part, the lowest first and selected. Each rank's panel starts with the same chip,
so a frontend that draws no Tab titles (VS Code) still says whose panel is shown.

The chips are one HTML widget for the whole row (one message when any rank's words change, not
one per rank), and every label change is only noted until ``flush_labels()`` sends it: the sink
decides when (at once in JupyterLab, within a message budget in VS Code and Colab).

A launch runs every rank; a cell on persistent workers may run on some of them only
(``ranks``): the view shows exactly those, each labelled with its true rank number.
Only widgets live here; when to update them is ``LiveViewSink``'s business (widgets.sink).

Example:
    >>> view = LaunchView(num_processes=2)
    >>> view.set_state(1, RUNNING)
    >>> view.flush_labels()  # the chip row, the tab titles
    2
    >>> view.tabs.titles
    ('rank 0 · waiting', 'rank 1 · running')
    >>> view.tabs.selected_index
    0
    >>> LaunchView(num_processes=4, ranks=[3, 1]).tabs.titles
    ('rank 1 · waiting', 'rank 3 · waiting')
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence
from typing import TypeVar

import ipywidgets as w

from nbaccel.output.status_words import RUNNING, WAITING, RankState  # noqa: F401 - RUNNING is used by the doctest
from nbaccel.output.widgets.rank_panel import RankPanel, close_tree

V = TypeVar("V")

# Plain CSS for the few things inline styles cannot do; scoped to the launch's class.
_STYLE = """<style>
.nbaccel-launch .widget-tab > .p-TabBar .p-TabBar-tab, .nbaccel-launch .widget-tab > .lm-TabBar .lm-TabBar-tab { min-width: 9em; }
.nbaccel-launch .nbaccel-rank-panel .jp-OutputArea-output pre { margin: 0; }
</style>"""


class LaunchView:
    """Header (title, chips, clock), failure banner and rank tabs of one launch attempt."""

    def __init__(
        self,
        num_processes: int,
        attempt: int = 0,
        log_dir: str | None = None,
        log_files: Callable[[int], str | None] | None = None,
        max_lines: int = 500,
        max_displays: int = 20,
        ranks: Sequence[int] | None = None,
    ) -> None:
        self.num_processes = num_processes
        self.ranks = taking_part(num_processes, ranks)
        self.attempt = attempt
        self.log_dir = log_dir
        self._log_file = log_files or (lambda rank: None)
        self._panel_options = {"max_lines": max_lines, "max_displays": max_displays}
        # Keyed by true rank number, in rank order (a subset's tabs are not 0..n-1).
        self.states: dict[int, RankState] = {rank: WAITING for rank in self.ranks}
        self.nodes: dict[int, str] = {}  # rank -> "node 1", across nodes: named in the tab title
        self.resources: dict[int, str] = {}  # rank -> "cpu 97% · 1.5 GiB" (at the end: its peak)
        self.peaks: dict[int, int] = {}  # rank -> most resident bytes sampled
        self.gpu_peaks: dict[int, int] = {}  # rank -> most device memory sampled (ranks on a GPU, where NVML says)
        self.cpu_times: dict[int, float] = {}  # rank -> CPU seconds it had used at its latest sample
        self.panels: dict[int, RankPanel] = {rank: self._new_panel(rank) for rank in self.ranks}
        self.chip_row = w.HTML(self._chips_html(), _dom_classes=("nbaccel-chips",))
        self.title = w.HTML(self._title_html())
        self.clock = w.HTML(_clock_html("starting"), layout=w.Layout(margin="0 0 0 auto"))
        self.banner = w.HTML("", layout=w.Layout(display="none"))
        self.tabs = w.Tab(children=self._tab_children(), titles=self._tab_titles(), selected_index=0 if self.ranks else None)
        header = w.HBox([self.title, self.chip_row, self.clock], layout=w.Layout(align_items="center", width="100%"))
        self._style = w.HTML(_STYLE)
        self.root = w.VBox([self._style, header, self.banner, self.tabs], layout=w.Layout(width="100%"), _dom_classes=("nbaccel-launch",))
        self._header = header
        self._clock_text = "starting"
        self._banner_text: str | None = None

    def chip(self, rank: int) -> str:
        """Rank ``rank``'s chip as html (its words: state, resources): in the row and its panel."""
        return chip_html(rank, self.states[rank], self.resources.get(rank), self.nodes.get(rank))

    def _chips_html(self) -> str:
        return "<div style='display:flex;flex-flow:row wrap'>" + "".join(self.chip(rank) for rank in self.states) + "</div>"

    @property
    def labels_pending(self) -> bool:
        """Whether a state, resource, node, clock or banner change waits for ``flush_labels()``."""
        return (
            self._chips_html() != self.chip_row.value
            or self._tab_titles() != tuple(self.tabs.titles)
            or _clock_html(self._clock_text) != self.clock.value
            or self._banner_text is not None
        )

    def flush_labels(self) -> int:
        """Send the changed chips, titles, clock and banner; the widget messages that took.
        (Each panel's own label goes with its ``sync()``.)"""
        sent = 0
        chips = self._chips_html()
        if chips != self.chip_row.value:
            self.chip_row.value = chips
            sent += 1
        titles = self._tab_titles()
        if titles != tuple(self.tabs.titles):
            self.tabs.titles = titles
            sent += 1
        clock = _clock_html(self._clock_text)
        if clock != self.clock.value:
            self.clock.value = clock
            sent += 1
        if self._banner_text is not None:
            sent += self._show_banner(self._banner_text)
            self._banner_text = None
        return sent

    def panel(self, rank: int) -> RankPanel:
        """Rank ``rank``'s panel; a rank the launch did not announce gets one (a tab, a chip)."""
        panel = self.panels.get(rank)
        return panel if panel is not None else self._add_rank(rank)

    def _add_rank(self, rank: int) -> RankPanel:
        """A tab and chip for an unannounced rank (an idle worker that printed), in rank order;
        the tab the user is looking at stays selected."""
        selected = self._selected_rank()
        self.states[rank] = WAITING
        self.panels[rank] = self._new_panel(rank)
        _sort_by_rank(self.states)
        _sort_by_rank(self.panels)
        with self.tabs.hold_sync():
            self.tabs.children = self._tab_children()
            self.tabs.titles = self._tab_titles()
            self.tabs.selected_index = list(self.panels).index(rank if selected is None else selected)
        return self.panels[rank]

    def _selected_rank(self) -> int | None:
        index = self.tabs.selected_index
        shown = list(self.panels)
        return shown[index] if index is not None and 0 <= index < len(shown) else None

    def _new_panel(self, rank: int) -> RankPanel:
        return RankPanel(rank, log_file=self._log_file(rank), label=self.chip(rank), **self._panel_options)

    def _tab_children(self) -> tuple[w.Widget, ...]:
        return tuple(p.widget for p in self.panels.values())

    def _tab_titles(self) -> tuple[str, ...]:
        return tuple(tab_title(r, s, self.nodes.get(r)) for r, s in self.states.items())

    def set_node(self, rank: int, node: str) -> None:
        """Name the node rank ``rank`` runs on in its tab title, chip and panel (launches across nodes)."""
        panel = self.panel(rank)
        if self.nodes.get(rank) != node:
            self.nodes[rank] = node
            panel.set_label(self.chip(rank))

    def set_state(self, rank: int, state: RankState) -> None:
        """Relabel rank ``rank``'s chip, tab and panel (sent by ``flush_labels`` and the panel's sync)."""
        panel = self.panel(rank)
        if self.states[rank] != state:
            self.states[rank] = state
            panel.set_label(self.chip(rank))

    def set_resources(self, rank: int, words: str) -> None:
        """Show what rank ``rank`` uses now (``cpu 97% · 1.5 GiB``) in its chip and panel."""
        panel = self.panel(rank)
        if self.resources.get(rank) != words:
            self.resources[rank] = words
            panel.set_label(self.chip(rank))

    def set_clock(self, text: str) -> None:
        self._clock_text = text

    def set_banner(self, text: str) -> None:
        """A line above the tabs that nobody can miss: which rank failed, and why."""
        self._banner_text = text

    def _show_banner(self, text: str) -> int:
        with self.banner.hold_sync():
            self.banner.value = (
                "<div style='background:#fce8e6;color:#a50e0e;border:1px solid #f6aea9;border-radius:4px;"
                f"padding:2px 8px;margin:2px 0'>✗ {html.escape(text)}</div>"
            )
            self.banner.layout.display = None
        return 2  # the banner's value and its layout's display

    def close(self) -> None:
        for panel in self.panels.values():
            panel.close()
        close_tree(self.root)

    def _title_html(self) -> str:
        ranks = ranks_words(self.ranks, self.num_processes)
        attempt = f" · attempt {self.attempt + 1}" if self.attempt else ""
        return f"<b>nbaccel</b>&nbsp;<span style='color:#5f6368'>{ranks}{attempt}</span>&nbsp;"


def taking_part(num_processes: int, ranks: Sequence[int] | None) -> tuple[int, ...]:
    """The ranks a launch runs, sorted: all of them unless ``ranks`` names some.

    Example:
        >>> taking_part(4, None), taking_part(4, [3, 1, 3])
        ((0, 1, 2, 3), (1, 3))
    """
    return tuple(range(num_processes)) if ranks is None else tuple(sorted({int(r) for r in ranks}))


def ranks_words(ranks: Sequence[int], num_processes: int) -> str:
    """How the header names the ranks of a launch: a count, or which ones of how many.

    Example:
        >>> ranks_words((0, 1), 2), ranks_words((1, 3), 4), ranks_words((2,), 4)
        ('2 ranks', 'ranks 1, 3 of 4', 'rank 2 of 4')
    """
    if tuple(ranks) == tuple(range(num_processes)):
        return f"{num_processes} rank{'s' if num_processes != 1 else ''}"
    listed = ", ".join(map(str, ranks))
    return f"rank{'s' if len(ranks) != 1 else ''} {listed} of {num_processes}"


def _sort_by_rank(table: dict[int, V]) -> None:
    """Reorder ``table`` in place by rank (dicts keep insertion order; the tabs follow it)."""
    ordered = sorted(table.items())
    table.clear()
    table.update(ordered)


def tab_title(rank: int, state: RankState, node: str | None = None) -> str:
    return f"rank {rank} · {node} · {state.short}" if node else f"rank {rank} · {state.short}"


def chip_html(rank: int, state: RankState, resources: str | None = None, node: str | None = None) -> str:
    """A rounded label: symbol and words first, colour only as a second cue; then where the rank
    runs (``node``, across nodes) and what it uses (``resources``, sampled by the kernel) in a
    quieter span. Everything it says is in its text (the tooltip repeats it, adds nothing)."""
    background, colour, border = state.colours
    where = f" · {html.escape(node)}" if node else ""
    use = f" <span class='nbaccel-resources' style='opacity:0.75'>· {html.escape(resources)}</span>" if resources else ""
    return (
        f"<span class='nbaccel-chip' data-rank='{rank}' title='rank {rank}: {html.escape(state.long)}' style='display:inline-block;padding:0 8px;"
        f"margin:1px 2px;border-radius:10px;font-size:12px;line-height:18px;background:{background};color:{colour};border:1px solid {border}'>"
        f"{state.symbol} rank {rank}{where} · {html.escape(state.long)}{use}</span>"
    )


def _clock_html(text: str) -> str:
    return f"<span style='color:#5f6368;font-size:12px'>{html.escape(text)}</span>"
