"""One rank's panel in the widget view: its label, its progress bars, its latest output, its error.

The panel's first line names its rank and state (and what it uses, where it runs): the same
words as the rank's chip and tab title, in the panel's own content, because VS Code draws no Tab
titles (ipywidgets #3657) and a panel must say whose it is wherever it is shown.

The panel keeps what it shows as plain Python data (``blocks``, ``bars``) and pushes it to the
widgets only in ``sync()``, which the sink calls at most about 20 times a second. Every change of
an ipywidgets ``Output`` resends its whole ``outputs`` list, so the log is a column of small
``Output`` blocks of at most ``chunk_lines`` lines: a sync resends only the newest block, and the
cap drops whole old blocks (their widgets are closed), keeping at least ``max_lines`` lines.
``sync()`` returns how many widget messages it sent, which a frontend's message budget counts
(``nbaccel.output.update_policy``).

Example:
    >>> panel = RankPanel(rank=0, max_lines=100, label="rank 0 · running")
    >>> panel.add_lines("stdout", ["epoch 1", "epoch 2"])
    >>> panel.sync()  # opens: a block's Output and its layout; updates: the log's children, the header
    4
    >>> "rank 0 · running" in panel.header.value
    True
    >>> panel.blocks[0].outputs
    [{'output_type': 'stream', 'name': 'stdout', 'text': 'epoch 1\\nepoch 2\\n'}]
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as w

from nbaccel.launch.outcome import RankOutcome
from nbaccel.output.status_words import failure_headline
from nbaccel.wire import rich

CHUNK_LINES = 100
MAX_LINE_CHARS = 10_000
LOG_HEIGHT = "26em"
MAX_BARS = 10  # finished bars kept in view per rank (running ones always stay)


@dataclass
class Block:
    """A run of output shown by one ``Output`` widget: text lines, or one display."""

    kind: str  # "text" or "display"
    outputs: list[dict[str, Any]] = field(default_factory=list)
    lines: int = 0
    display_id: str | None = None
    widget: w.Output | None = None
    dirty: bool = True


@dataclass
class Bar:
    """The latest state of one progress bar (a ``progress`` event) and its widgets."""

    state: dict[str, Any]
    widget: w.HBox | None = None
    dirty: bool = True


class RankPanel:
    """The panel of rank ``rank``: bars on top, then a notice, then the log (newest at the bottom)."""

    def __init__(
        self, rank: int, max_lines: int = 500, max_displays: int = 20, chunk_lines: int = CHUNK_LINES, log_file: str | None = None, label: str = ""
    ) -> None:
        self.rank = rank
        self.label = label  # html: the rank's chip (rank, state, resources), its first line
        self.max_lines = max_lines
        self.max_displays = max_displays
        self.chunk_lines = max(1, min(chunk_lines, max_lines))
        self.log_file = log_file
        self.blocks: list[Block] = []
        self.bars: dict[int, Bar] = {}
        self.dropped_lines = 0
        self.dropped_displays = 0
        self.total_lines = 0
        self.failure: RankOutcome | None = None
        self._clear_pending = False
        self._shown_blocks: list[Block] = []
        self._retired: list[Block] = []
        self._bars_changed = False
        self._retired_bars: list[Bar] = []
        self._failure_dirty = False
        # The traceback's and the bars' widgets are made when first needed: every widget is a comm
        # open when the view is shown, and VS Code takes seconds for a few dozen (vscode-jupyter #7965).
        self._bars: w.VBox | None = None
        self._closed = False
        self._error: w.Output | None = None
        self.header = w.HTML(self._header_html(), layout=w.Layout(margin="0 0 2px 0"), _dom_classes=("nbaccel-rank-header",))
        self._log = w.Box(layout=w.Layout(display="flex", flex_flow="column-reverse", max_height=LOG_HEIGHT, overflow="auto", width="100%"))
        self.widget = w.VBox([self.header, self._log], _dom_classes=("nbaccel-rank-panel",))

    # -- changes (cheap, Python only) ---------------------------------------------------------

    def add_lines(self, stream: str, lines: list[str]) -> None:
        """Append whole lines of ``stream`` ("stdout" or "stderr")."""
        if not lines:
            return
        self._apply_pending_clear()
        self.total_lines += len(lines)
        rest = [_clip(line) for line in lines]
        while rest:
            block = self._tail_text_block()
            room = self.chunk_lines - block.lines
            taken, rest = rest[:room], rest[room:]
            _append_stream(block.outputs, stream, taken)
            block.lines += len(taken)
            block.dirty = True
        self._cap()

    def add_display(self, event: dict[str, Any]) -> None:
        """Show a ``display`` event; an update replaces the output with the same display id."""
        output = {"output_type": "display_data", "data": event["data"], "metadata": event.get("metadata") or {}}
        display_id = event.get("display_id")
        if event.get("update"):
            for block in self.blocks:
                if display_id and block.display_id == display_id:
                    block.outputs = [output]
                    block.dirty = True
            return  # updating an id nobody shows does nothing, as in Jupyter
        self._apply_pending_clear()
        self.blocks.append(Block("display", [output], display_id=display_id))
        self._cap()

    def clear(self, wait: bool = False) -> None:
        """``clear_output()`` from the rank: now, or (``wait``) when the next output comes."""
        if wait:
            self._clear_pending = True
        else:
            self._clear_all()

    def set_progress(self, event: dict[str, Any]) -> None:
        """The latest state of one bar; a bar closed with ``leave=False`` goes away, as in tqdm."""
        bar = self.bars.get(event["bar"])
        if bar is None:
            bar = self.bars[event["bar"]] = Bar(dict(event))
            self._bars_changed = True
        bar.state = dict(event)
        bar.dirty = True
        if event.get("closed") and not event.get("leave", True):
            self._retire_bar(event["bar"])
        finished = [key for key, b in self.bars.items() if b.state.get("closed")]
        for key in finished[: max(0, len(self.bars) - MAX_BARS)]:
            self._retire_bar(key)  # a loop that leaves a bar per epoch: keep the latest ones

    def set_label(self, label: str) -> None:
        """The panel's first line (html: the rank's chip); sent at the next ``sync()``."""
        self.label = label

    def set_failure(self, outcome: RankOutcome) -> None:
        """The rank failed: its panel starts with why (the traceback), and unfinished bars turn red."""
        self.failure = outcome
        self._failure_dirty = True
        for bar in self.bars.values():
            if not bar.state.get("closed") and rich.progress_fraction(bar.state) != 1.0:
                bar.state = {**bar.state, "failed": True}
                bar.dirty = True

    @property
    def visible_lines(self) -> int:
        return sum(b.lines for b in self.blocks if b.kind == "text")

    @property
    def has_changes(self) -> bool:
        return bool(
            self._header_html() != self.header.value
            or self._bars_changed
            or self._failure_dirty
            or self._retired
            or self._retired_bars
            or any(b.dirty for b in self.blocks)
            or any(b.dirty for b in self.bars.values())
        )

    # -- pushing to the widgets ------------------------------------------------------------------

    def sync(self) -> int:
        """Send what changed since the last sync (one message per changed widget); how many
        widget messages that was (opens and closes included)."""
        if self._closed:
            return 0  # the view ended (an interrupt can close it between a rank's event and its sync): a widget made now would never close
        sent = self._sync_failure() if self._failure_dirty else 0
        sent += self._sync_bars()
        # Widgets of dropped blocks are reused for new ones: a burst of lines then costs one
        # outputs update per visible block instead of opening and closing widgets.
        spare = [b.widget for b in self._retired if b.widget is not None]
        self._retired.clear()
        for block in self.blocks:
            if block.widget is None and spare:
                block.widget, block.dirty = spare.pop(), True
            if block.widget is None:
                block.widget = w.Output(outputs=_snapshot(block.outputs))
                sent += tree_size(block.widget)
            elif block.dirty:
                block.widget.outputs = _snapshot(block.outputs)
                sent += 1
            block.dirty = False
        if [id(b) for b in self.blocks] != [id(b) for b in self._shown_blocks]:
            self._log.children = tuple(b.widget for b in reversed(self.blocks) if b.widget is not None)
            self._shown_blocks = list(self.blocks)
            sent += 1
        for widget in spare:
            sent += close_tree(widget)
        header = self._header_html()
        if header != self.header.value:
            self.header.value = header
            sent += 1
        return sent

    def close(self) -> None:
        """Close every widget of the panel (the kernel forgets them; views disappear); later syncs send nothing."""
        self._closed = True
        for lazy in (self._error, self._bars):  # made when first needed: closed even if an interrupt came before they were laid out
            if lazy is not None:
                close_tree(lazy)
        for block in self.blocks + self._retired:
            if block.widget is not None:
                close_tree(block.widget)
        for bar in [*self.bars.values(), *self._retired_bars]:
            _close_bar(bar)
        close_tree(self.widget)

    # -- internals -------------------------------------------------------------------------------

    def _retire_bar(self, key: int) -> None:
        self._retired_bars.append(self.bars.pop(key))
        self._bars_changed = True

    def _tail_text_block(self) -> Block:
        if self.blocks and self.blocks[-1].kind == "text" and self.blocks[-1].lines < self.chunk_lines:
            return self.blocks[-1]
        block = Block("text")
        self.blocks.append(block)
        return block

    def _cap(self) -> None:
        """Drop the oldest blocks beyond the caps, keeping at least ``max_lines`` lines."""
        while True:
            text = [b for b in self.blocks if b.kind == "text"]
            if text and self.visible_lines - text[0].lines >= self.max_lines:
                self.dropped_lines += text[0].lines
                self._retire(text[0])
                continue
            shown = [b for b in self.blocks if b.kind == "display"]
            if len(shown) > self.max_displays:
                self.dropped_displays += 1
                self._retire(shown[0])
                continue
            return

    def _retire(self, block: Block) -> None:
        self.blocks.remove(block)
        self._retired.append(block)

    def _apply_pending_clear(self) -> None:
        if self._clear_pending:
            self._clear_pending = False
            self._clear_all()

    def _clear_all(self) -> None:
        for block in list(self.blocks):
            self._retire(block)

    def _sync_failure(self) -> int:
        self._failure_dirty = False
        outcome = self.failure
        if outcome is None:
            return 0
        if self._error is not None:
            self._error.outputs = _snapshot(failure_outputs(outcome))
            return 1
        self._error = w.Output(outputs=_snapshot(failure_outputs(outcome)))
        self._lay_out()
        return tree_size(self._error) + 1

    def _lay_out(self) -> None:
        """The panel's column: its label, why it failed, its bars, its log (what exists of them)."""
        parts = [self.header, self._error, self._bars, self._log]
        self.widget.children = tuple(part for part in parts if part is not None)

    def _sync_bars(self) -> int:
        sent = 0
        for bar in self.bars.values():
            if bar.widget is None:
                bar.widget = _bar_widget()
                bar.dirty = True
                sent += tree_size(bar.widget)
            if bar.dirty:
                sent += _update_bar(bar.widget, bar.state)
                bar.dirty = False
        if self._bars_changed:
            children = tuple(b.widget for b in self.bars.values() if b.widget is not None)
            if self._bars is None:
                self._bars = w.VBox(children)
                self._lay_out()
                sent += 3  # opens: the box and its layout (its bars are counted above); an update: the column
            else:
                self._bars.children = children
                sent += 1
            self._bars_changed = False
        for bar in self._retired_bars:
            sent += _close_bar(bar)
        self._retired_bars.clear()
        return sent

    def dropped_words(self) -> str:
        """'1,200 earlier lines and 3 earlier displays': what the view no longer holds ('' if none)."""
        dropped = []
        if self.dropped_lines:
            dropped.append(f"{self.dropped_lines:,} earlier line{'s' if self.dropped_lines != 1 else ''}")
        if self.dropped_displays:
            dropped.append(f"{self.dropped_displays:,} earlier display{'s' if self.dropped_displays != 1 else ''}")
        return " and ".join(dropped)

    def _header_html(self) -> str:
        """The rank's label, then what the view no longer shows (or that nothing came yet)."""
        label = f"<div class='nbaccel-rank-label'>{self.label}</div>" if self.label else ""
        return label + self._notice_html()

    def _notice_html(self) -> str:
        parts = []
        if self.dropped_lines or self.dropped_displays:
            where = f" &mdash; the full log is in <code>{html.escape(self.log_file)}</code>" if self.log_file else ""
            parts.append(f"{self.dropped_words()} not shown here (the view keeps the latest {self.max_lines:,} lines){where}")
        elif not self.blocks and not self.bars and self.failure is None:
            parts.append("no output yet")
        if not parts:
            return ""
        return f"<span style='color:#5f6368;font-size:12px'>{parts[0]}</span>"


def failure_outputs(outcome: RankOutcome) -> list[dict[str, Any]]:
    """Jupyter outputs that say why ``outcome`` failed: its traceback as an error output."""
    error = outcome.error
    headline = failure_headline(outcome)
    if error is not None and error.traceback:
        return [
            {"output_type": "error", "ename": error.type_name, "evalue": error.message, "traceback": [headline, *error.traceback.rstrip("\n").splitlines()]}
        ]
    return [{"output_type": "stream", "name": "stderr", "text": headline + "\n"}]


def _snapshot(outputs: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """Copies: the stream dicts grow in place, and a trait set to an equal value sends nothing."""
    return tuple(dict(output) for output in outputs)


def _append_stream(outputs: list[dict[str, Any]], stream: str, lines: list[str]) -> None:
    text = "".join(line + "\n" for line in lines)
    if outputs and outputs[-1].get("name") == stream:
        outputs[-1]["text"] += text
    else:
        outputs.append({"output_type": "stream", "name": stream, "text": text})


def _clip(line: str) -> str:
    if len(line) <= MAX_LINE_CHARS:
        return line
    return line[:MAX_LINE_CHARS] + f" … [{len(line) - MAX_LINE_CHARS:,} more characters in the log]"


def close_tree(widget: w.Widget) -> int:
    """Close ``widget``, its children and its layout/style models (``close()`` alone leaves
    those in ipywidgets' registry forever: about 50 models per launch); how many were closed."""
    models = _tree(widget)
    for model in models:
        model.close()
    return len(models)


def tree_size(widget: w.Widget) -> int:
    """The widget models ``widget`` stands for (itself, its layout and style, its children's):
    one comm open each when it is first shown, one close each at the end."""
    return len(_tree(widget))


def _tree(widget: w.Widget) -> list[w.Widget]:
    found: list[w.Widget] = []
    for name in widget.keys:
        value = getattr(widget, name, None)
        if isinstance(value, w.Widget):
            found.extend(_tree(value))
        elif isinstance(value, (tuple, list)):
            for item in value:
                if isinstance(item, w.Widget):
                    found.extend(_tree(item))
    found.append(widget)
    return found


def _close_bar(bar: Bar) -> int:
    closed = 0
    if bar.widget is not None:
        closed = close_tree(bar.widget)
        bar.widget = None
    return closed


def _bar_widget() -> w.HBox:
    left = w.HTML(layout=w.Layout(flex="0 0 auto"))
    progress = w.FloatProgress(min=0.0, max=1.0, value=0.0, layout=w.Layout(flex="1 1 auto", width="auto", max_width="40em"))
    right = w.HTML(layout=w.Layout(flex="0 0 auto"))
    return w.HBox([left, progress, right], layout=w.Layout(width="100%", align_items="center"), _dom_classes=("nbaccel-progress",))


def _update_bar(box: w.HBox, state: dict[str, Any]) -> int:
    """Show ``state`` in a bar's widgets; the messages that took (unchanged traits send none)."""
    left, progress, right = box.children
    fraction = rich.progress_fraction(state)
    style = "danger" if state.get("failed") else "success" if state.get("closed") and fraction in (None, 1.0) else ""
    value, bar_style = 1.0 if fraction is None else fraction, "info" if fraction is None and not style else style
    sent = int((progress.value, progress.bar_style) != (value, bar_style))
    with progress.hold_sync():
        progress.value = value
        progress.bar_style = bar_style
    for widget, text in ((left, _mono(state.get("left", ""))), (right, _mono(state.get("right", "")))):
        sent += int(widget.value != text)
        widget.value = text
    return sent


def _mono(text: str) -> str:
    return f"<span style='font-family:var(--jp-code-font-family,monospace);white-space:pre;font-size:12px'>{html.escape(text)}</span>"
