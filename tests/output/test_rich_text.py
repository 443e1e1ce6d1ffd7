"""RichTextSink: rich output as labelled text; progress bars print a handful of lines, not hundreds.

Imports internals (output.text): it tests those units directly, below the public face.
"""

from __future__ import annotations

import io

from nbaccel.output.text import RichTextSink


def _bar(n: float, total: float | None, closed: bool = False, leave: bool = True, bar: int = 0) -> dict:
    return {
        "type": "progress",
        "bar": bar,
        "n": n,
        "total": total,
        "left": "",
        "right": "",
        "text": f"train {n}/{total}",
        "closed": closed,
        "leave": leave,
        "failed": False,
    }


def test_a_bar_of_a_thousand_updates_prints_a_few_states_and_its_final_one() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out, min_interval=0.0)
    for n in range(1001):
        sink.event(0, _bar(n, 1000))
    sink.event(0, _bar(1000, 1000, closed=True))
    lines = out.getvalue().splitlines()
    assert lines == [
        "[rank 0] train 0/1000",
        "[rank 0] train 250/1000",
        "[rank 0] train 500/1000",
        "[rank 0] train 750/1000",
        "[rank 0] train 1000/1000",
        "[rank 0] train 1000/1000",
    ]


def test_milestones_are_throttled_in_time_too() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out, min_interval=60.0)
    for n in range(101):
        sink.event(1, _bar(n, 100))
    sink.event(1, _bar(100, 100, closed=True))
    assert out.getvalue().splitlines() == ["[rank 1] train 0/100", "[rank 1] train 100/100"]


def test_an_inner_bar_that_vanishes_prints_nothing_unless_it_lasts() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out, quiet_interval=3600)
    for epoch in range(50):
        for n in range(11):
            sink.event(0, _bar(n, 10, leave=False, bar=epoch))
        sink.event(0, _bar(10, 10, closed=True, leave=False, bar=epoch))
    assert out.getvalue() == ""


def test_a_bar_without_a_total_prints_at_most_every_quiet_interval() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out, quiet_interval=3600)
    for n in range(500):
        sink.event(0, _bar(n, None))
    assert out.getvalue().splitlines() == ["[rank 0] train 0/None"]


def test_display_data_shows_its_text_plain_labelled_with_the_rank() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out)
    sink.event(3, {"type": "display", "data": {"text/plain": "   a  b\n0  1  2", "text/html": "<table/>"}})
    sink.event(3, {"type": "display", "data": {"image/png": "iVBOR"}})
    sink.event(3, {"type": "started", "pid": 12})
    sink.event(3, {"type": "clear_output", "wait": True})
    assert out.getvalue().splitlines() == ["[rank 3]    a  b", "[rank 3] 0  1  2", "[rank 3] [image/png]"]
