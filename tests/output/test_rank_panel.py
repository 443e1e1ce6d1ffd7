"""One rank's panel: chunked log, cap with a notice, displays, progress bars, failure first.

Imports internals (launch.outcome, output.widgets.rank_panel): it tests those units directly, below the public face.
"""

from __future__ import annotations

import pytest

from nbaccel.launch.outcome import RankOutcome, RemoteError, Status
from nbaccel.output.widgets.rank_panel import RankPanel
from tests.output.conftest import CommLog


def _text(panel: RankPanel) -> list[str]:
    lines: list[str] = []
    for block in panel.blocks:
        for output in block.outputs:
            if output["output_type"] == "stream":
                lines.extend(output["text"].rstrip("\n").split("\n"))
    return lines


def _progress(bar: int, n: float, total: float | None, closed: bool = False, leave: bool = True) -> dict:
    return {
        "type": "progress",
        "bar": bar,
        "n": n,
        "total": total,
        "left": f"step: {n}",
        "right": f"{n}/{total}",
        "text": f"step {n}/{total}",
        "closed": closed,
        "leave": leave,
        "failed": False,
    }


def test_lines_stay_in_order_across_chunks_and_streams(comms: CommLog) -> None:
    panel = RankPanel(rank=0, max_lines=1000, chunk_lines=3)
    panel.add_lines("stdout", ["a", "b"])
    panel.add_lines("stderr", ["c"])
    panel.add_lines("stdout", ["d", "e", "f", "g"])
    panel.sync()
    assert _text(panel) == list("abcdefg")
    assert [b.lines for b in panel.blocks] == [3, 3, 1]
    assert panel.blocks[0].outputs[1] == {"output_type": "stream", "name": "stderr", "text": "c\n"}


def test_the_log_shows_newest_first_in_a_bottom_anchored_column(comms: CommLog) -> None:
    panel = RankPanel(rank=0, chunk_lines=2)
    panel.add_lines("stdout", ["1", "2", "3"])
    panel.sync()
    (log,) = [c for c in comms if c.model_name == "BoxModel"]
    children = log.updates("children")[-1]
    assert children == [f"IPY_MODEL_{b.widget.model_id}" for b in reversed(panel.blocks)]
    layout = next(c for c in comms if c.comm_id == log.data["state"]["layout"].removeprefix("IPY_MODEL_"))
    assert layout.data["state"]["flex_flow"] == "column-reverse"  # the view stays scrolled to the newest line


def test_cap_keeps_the_latest_lines_and_says_how_many_were_dropped_and_where_the_log_is(comms: CommLog) -> None:
    panel = RankPanel(rank=3, max_lines=10, chunk_lines=4, log_file="/logs/rank3.log")
    panel.add_lines("stdout", [f"line {i}" for i in range(25)])
    panel.sync()
    shown = _text(panel)
    assert shown == [f"line {i}" for i in range(25 - len(shown), 25)]
    assert 10 <= len(shown) < 14
    assert panel.dropped_lines == 25 - len(shown)
    notice = panel.header.value
    assert f"{panel.dropped_lines} earlier lines" in notice and "/logs/rank3.log" in notice


def test_a_sync_resends_only_the_newest_block(comms: CommLog) -> None:
    panel = RankPanel(rank=0, max_lines=1000, chunk_lines=100)
    panel.add_lines("stdout", [f"x{i}" for i in range(150)])
    panel.sync()
    _, second = (b.widget for b in panel.blocks)
    before = {c.comm_id: len(c.sent) for c in comms}
    panel.add_lines("stdout", ["y"])
    panel.sync()
    changed = [c for c in comms if len(c.sent) != before.get(c.comm_id, 0)]
    assert [c.comm_id for c in changed] == [second.model_id]
    assert changed[0].updates("outputs")[-1][-1]["text"].endswith("x149\ny\n")


def test_nothing_is_sent_when_nothing_changed(comms: CommLog) -> None:
    panel = RankPanel(rank=0)
    panel.add_lines("stdout", ["a"])
    panel.sync()
    count = comms.messages()
    panel.sync()
    assert comms.messages() == count and not panel.has_changes


def test_displays_are_shown_updated_by_id_and_capped(comms: CommLog) -> None:
    panel = RankPanel(rank=0, max_displays=2)
    panel.add_display({"data": {"text/html": "<b>1</b>"}, "display_id": "fig"})
    panel.add_lines("stdout", ["between"])
    panel.add_display({"data": {"text/html": "<b>2</b>"}, "display_id": "fig", "update": True})
    assert panel.blocks[0].outputs[0]["data"] == {"text/html": "<b>2</b>"}
    panel.add_display({"data": {"text/plain": "b"}})
    panel.add_display({"data": {"text/plain": "c"}})
    assert [b.outputs[0].get("data", {}).get("text/plain") for b in panel.blocks if b.kind == "display"] == ["b", "c"]
    assert panel.dropped_displays == 1


@pytest.mark.parametrize("wait", [False, True])
def test_clear_output_empties_the_log_now_or_at_the_next_output(comms: CommLog, wait: bool) -> None:
    panel = RankPanel(rank=0)
    panel.add_lines("stdout", ["old"])
    panel.clear(wait=wait)
    assert _text(panel) == (["old"] if wait else [])
    panel.add_lines("stdout", ["new"])
    assert _text(panel) == ["new"]
    assert panel.dropped_lines == 0  # cleared on purpose, not dropped


def test_progress_bars_update_in_place_and_leave_false_bars_go_away(comms: CommLog) -> None:
    panel = RankPanel(rank=0)
    panel.set_progress(_progress(0, 0, 10))
    panel.set_progress(_progress(1, 0, None, leave=False))
    panel.sync()
    panel.set_progress(_progress(0, 5, 10))
    panel.set_progress(_progress(1, 3, None, closed=True, leave=False))
    panel.sync()
    assert list(panel.bars) == [0]
    progress = comms.of("FloatProgressModel")
    assert progress[0].updates("value")[-1] == pytest.approx(0.5)
    assert progress[1].closed  # the vanished bar's widgets are closed, not just hidden
    panel.set_progress(_progress(0, 10, 10, closed=True))
    panel.sync()
    assert progress[0].updates("bar_style")[-1] == "success"


def test_a_failed_rank_starts_with_its_traceback_and_unfinished_bars_turn_red(comms: CommLog) -> None:
    panel = RankPanel(rank=1)
    panel.set_progress(_progress(0, 3, 10))
    panel.add_lines("stdout", ["working"])
    panel.sync()
    error = RemoteError("ValueError", "boom", 'Traceback (most recent call last):\n  File "cell", line 2\nValueError: boom\n', 0.0)
    panel.set_failure(RankOutcome(rank=1, status=Status.FAILED, exitcode=1, error=error))
    panel.sync()
    label, first_child = panel.widget.children[:2]  # the rank's label, then why it failed
    assert label is panel.header and first_child is panel._error
    (output,) = panel._error.outputs
    assert output["output_type"] == "error" and output["ename"] == "ValueError"
    assert output["traceback"][0] == "rank 1 failed: ValueError: boom" and output["traceback"][-1] == "ValueError: boom"
    assert comms.of("FloatProgressModel")[0].updates("bar_style")[-1] == "danger"


def test_a_rank_killed_by_a_signal_says_so_in_words(comms: CommLog) -> None:
    panel = RankPanel(rank=2)
    panel.set_failure(RankOutcome(rank=2, status=Status.SIGNALED, signal=9))
    panel.sync()
    assert panel._error.outputs[0]["text"] == "rank 2 failed: killed by SIGKILL\n"


def test_close_closes_every_widget_it_made(comms: CommLog) -> None:
    panel = RankPanel(rank=0, max_lines=5, chunk_lines=2)
    panel.set_progress(_progress(0, 1, 2))
    panel.add_display({"data": {"text/plain": "x"}})
    panel.add_lines("stdout", [str(i) for i in range(20)])
    panel.sync()
    panel.set_failure(RankOutcome(rank=0, status=Status.EXITED, exitcode=3))
    panel.sync()
    panel.close()
    assert comms and all(c.closed for c in comms)


def test_very_long_lines_are_clipped_in_the_view(comms: CommLog) -> None:
    panel = RankPanel(rank=0)
    panel.add_lines("stdout", ["x" * 50_000])
    assert "more characters in the log" in _text(panel)[0] and len(_text(panel)[0]) < 11_000


def test_bursts_reuse_the_block_widgets_instead_of_opening_new_ones(comms: CommLog) -> None:
    panel = RankPanel(rank=0, max_lines=300, chunk_lines=100)
    for burst in range(10):
        panel.add_lines("stdout", [f"{burst}:{i}" for i in range(1000)])
        panel.sync()
    assert len(comms.of("OutputModel")) <= 5  # the error box and the blocks in view, not one per chunk
    assert _text(panel)[-1] == "9:999" and panel.dropped_lines == 10_000 - panel.visible_lines
    shown = [o["text"] for b in panel.blocks for o in b.widget.outputs]
    assert "".join(shown).splitlines() == _text(panel)


def test_a_closed_panel_makes_no_widget_when_a_failure_or_lines_come_after(comms: CommLog) -> None:
    """An interrupt can close the view between a rank's last event and the panel's sync: a widget
    made then would be a comm the frontend keeps open for ever."""
    panel = RankPanel(rank=1, max_lines=100)
    panel.add_lines("stdout", ["before"])
    panel.sync()
    panel.close()
    opened = len(comms)
    panel.set_failure(RankOutcome(rank=1, status=Status.SIGNALED, signal=9))
    panel.add_lines("stdout", ["after"])
    assert panel.sync() == 0 and len(comms) == opened


def test_closing_a_panel_closes_its_lazily_made_widgets_even_if_never_laid_out(comms: CommLog) -> None:
    panel = RankPanel(rank=0, max_lines=100)
    panel.set_failure(RankOutcome(rank=0, status=Status.EXITED, exitcode=3))
    panel.sync()
    panel.widget.children = (panel.header, panel._log)  # as if an interrupt came between making the traceback's widget and laying it out
    panel.close()
    assert all(comm.closed for comm in comms), [c.model_name for c in comms if not c.closed]
