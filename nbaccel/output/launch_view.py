"""The widget of one launch: a header (a status chip per rank, the elapsed time) above one tab
per rank, rank 0 first and selected.

Only widgets live here; when to update them is ``WidgetSink``'s business.

Example:
    >>> view = LaunchView(num_processes=2)
    >>> view.set_state(1, RUNNING)
    >>> view.tabs.titles
    ('rank 0 · waiting', 'rank 1 · running')
    >>> view.tabs.selected_index
    0
"""

from __future__ import annotations

import html
from collections.abc import Callable

import ipywidgets as w

from .rank_panel import RankPanel, close_tree
from .status_text import RUNNING, WAITING, RankState  # noqa: F401 - RUNNING is used by the doctest

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
    ) -> None:
        self.num_processes = num_processes
        self.attempt = attempt
        self.log_dir = log_dir
        self.states = [WAITING] * num_processes
        self._log_file = log_files or (lambda rank: None)
        self._panel_options = {"max_lines": max_lines, "max_displays": max_displays}
        self.panels = [self._new_panel(rank) for rank in range(num_processes)]
        self.title = w.HTML(self._title_html())
        self.chips = [w.HTML(chip_html(rank, WAITING)) for rank in range(num_processes)]
        self.clock = w.HTML(_clock_html("starting"), layout=w.Layout(margin="0 0 0 auto"))
        self.banner = w.HTML("", layout=w.Layout(display="none"))
        self.tabs = w.Tab(children=[p.widget for p in self.panels], titles=[tab_title(r, WAITING) for r in range(num_processes)], selected_index=0)
        self._chip_row = w.HBox(self.chips, layout=w.Layout(flex_flow="row wrap"))
        header = w.HBox([self.title, self._chip_row, self.clock], layout=w.Layout(align_items="center", width="100%"))
        self._style = w.HTML(_STYLE)
        self.root = w.VBox([self._style, header, self.banner, self.tabs], layout=w.Layout(width="100%"), _dom_classes=("nbaccel-launch",))
        self._header = header

    def panel(self, rank: int) -> RankPanel:
        """Rank ``rank``'s panel; a rank beyond the launch's count gets one (and a tab, a chip)."""
        if rank >= len(self.panels):
            for new in range(len(self.panels), rank + 1):
                self.panels.append(self._new_panel(new))
                self.states.append(WAITING)
                self.chips.append(w.HTML(chip_html(new, WAITING)))
            self._chip_row.children = tuple(self.chips)
            with self.tabs.hold_sync():
                self.tabs.children = tuple(p.widget for p in self.panels)
                self.tabs.titles = tuple(tab_title(r, s) for r, s in enumerate(self.states))
        return self.panels[rank]

    def _new_panel(self, rank: int) -> RankPanel:
        return RankPanel(rank, log_file=self._log_file(rank), **self._panel_options)

    def set_state(self, rank: int, state: RankState) -> None:
        """Relabel rank ``rank``'s chip and tab (one message each, only if the words changed)."""
        self.panel(rank)
        if self.states[rank] == state:
            return
        self.states[rank] = state
        self.chips[rank].value = chip_html(rank, state)
        self.tabs.titles = tuple(tab_title(r, s) for r, s in enumerate(self.states))

    def set_clock(self, text: str) -> None:
        value = _clock_html(text)
        if value != self.clock.value:
            self.clock.value = value

    def set_banner(self, text: str) -> None:
        """A line above the tabs that nobody can miss: which rank failed, and why."""
        with self.banner.hold_sync():
            self.banner.value = (
                "<div style='background:#fce8e6;color:#a50e0e;border:1px solid #f6aea9;border-radius:4px;"
                f"padding:2px 8px;margin:2px 0'>✗ {html.escape(text)}</div>"
            )
            self.banner.layout.display = None

    def close(self) -> None:
        for panel in self.panels:
            panel.close()
        close_tree(self.root)

    def _title_html(self) -> str:
        ranks = f"{self.num_processes} rank{'s' if self.num_processes != 1 else ''}"
        attempt = f" · attempt {self.attempt + 1}" if self.attempt else ""
        return f"<b>nbaccel</b>&nbsp;<span style='color:#5f6368'>{ranks}{attempt}</span>&nbsp;"


def tab_title(rank: int, state: RankState) -> str:
    return f"rank {rank} · {state.short}"


def chip_html(rank: int, state: RankState) -> str:
    """A rounded label: symbol and words first, colour only as a second cue."""
    background, colour, border = state.colours
    return (
        f"<span title='rank {rank}: {html.escape(state.long)}' style='display:inline-block;padding:0 8px;margin:1px 2px;"
        f"border-radius:10px;font-size:12px;line-height:18px;background:{background};color:{colour};border:1px solid {border}'>"
        f"{state.symbol} rank {rank} · {html.escape(state.long)}</span>"
    )


def _clock_html(text: str) -> str:
    return f"<span style='color:#5f6368;font-size:12px'>{html.escape(text)}</span>"

