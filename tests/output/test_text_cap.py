"""The text view's cap on a loud rank: the cell gets the first lines (at a bounded rate), one
notice, and at the end the count held back and the rank's last lines; the log file gets every line.

Imports internals (output.text, output.text_cap): it tests those units directly, below the public face.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from nbaccel import RankFailedError, notebook_launcher
from nbaccel.launch.outcome import RankOutcome, Status
from nbaccel.output.sinks import TextSink
from nbaccel.output.text import RichTextSink
from nbaccel.output.text_cap import ENV_VAR, LineCap, from_env


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _sink(tmp_path: Path, clock: Clock, **cap: object) -> tuple[RichTextSink, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    return RichTextSink(stdout=out, stderr=err, log_root=tmp_path / "logs", clock=clock, **cap), out, err  # type: ignore[arg-type]


def _finish(sink: RichTextSink, ranks: int) -> None:
    for rank in range(ranks):
        sink.rank_finished(RankOutcome(rank, Status.SUCCEEDED, exitcode=0))
    sink.launch_finished([RankOutcome(rank, Status.SUCCEEDED) for rank in range(ranks)])


def test_below_the_cap_the_cell_gets_the_same_bytes_as_without_one(tmp_path: Path) -> None:
    capped, out, err = _sink(tmp_path, Clock(), max_lines=100, max_rate=1000.0)
    plain_out, plain_err = io.StringIO(), io.StringIO()
    plain = RichTextSink(stdout=plain_out, stderr=plain_err)
    for sink in (capped, plain):
        sink.launch_started(2, attempt=0)
        sink.output(0, "stdout", [f"line {i}" for i in range(60)])
        sink.output(1, "stderr", ["warning: x", "ünïcode ✓"])
        sink.event(1, {"type": "display", "data": {"text/plain": "<Figure size 640x480>"}})
        _finish(sink, 2)
    assert out.getvalue() == plain_out.getvalue() and err.getvalue() == plain_err.getvalue()
    assert capped.logs is not None and capped.logs.folder is not None
    assert (capped.logs.folder / "rank1.log").read_text() == "warning: x\nünïcode ✓\n<Figure size 640x480>\n"  # the display logged once


def test_beyond_max_lines_one_notice_then_the_count_and_the_last_lines_at_the_end(tmp_path: Path) -> None:
    clock = Clock()
    sink, out, _ = _sink(tmp_path, clock, max_lines=5, max_rate=None, tail=3)
    sink.launch_started(2, attempt=0)
    for batch in range(10):
        sink.output(1, "stdout", [f"l{batch * 10 + i}" for i in range(10)])
        if batch < 3:
            sink.output(0, "stdout", [f"quiet {batch}"])  # another rank's budget: its own
    log = sink.logs.file_for(1) if sink.logs else None
    _finish(sink, 2)
    lines = out.getvalue().splitlines()
    ranks1 = [line for line in lines if line.startswith("[rank 1]")]
    assert ranks1 == [f"[rank 1] l{i}" for i in range(5)] + ["[rank 1] l97", "[rank 1] l98", "[rank 1] l99"]
    assert [line for line in lines if line.startswith("[rank 0]")] == [f"[rank 0] quiet {b}" for b in range(3)]
    assert not any(line.startswith("nbaccel: rank 0") for line in lines)
    notices = [line for line in lines if line.startswith("nbaccel: rank 1")]
    assert notices == [
        f"nbaccel: rank 1: more than 5 lines: the rest of this launch's are held back from the cell (every line is in {log})",
        f"nbaccel: rank 1: 95 of 100 lines held back from the cell, all in {log}; its last 3:",
    ]
    assert log is not None and log.read_text().splitlines() == [f"l{i}" for i in range(100)]  # nothing lost


def test_once_lines_are_held_back_a_debugger_prompt_repeats_its_text(tmp_path: Path) -> None:
    sink, _, _ = _sink(tmp_path, Clock(), max_lines=2, max_rate=None)
    sink.launch_started(1, attempt=0)
    sink.output(0, "stdout", ["a", "b"])
    assert sink.lines_in_cell  # every line so far is in the cell: pdb's prompt need not repeat them
    sink.output(0, "stdout", ["> cell(3)", "-> x = 1"])
    assert not sink.lines_in_cell
    sink.launch_finished([])
    sink.launch_started(1, attempt=1)
    assert sink.lines_in_cell
    sink.launch_finished([])


def test_the_rate_cap_holds_a_burst_and_lets_lines_through_again_once_the_rank_slows(tmp_path: Path) -> None:
    clock = Clock()
    sink, out, _ = _sink(tmp_path, clock, max_lines=None, max_rate=10.0, tail=2)
    sink.launch_started(1, attempt=0)
    sink.output(0, "stdout", [f"burst {i}" for i in range(25)])  # one second's worth goes through, 15 held
    clock.now += 0.5
    sink.output(0, "stdout", [f"half {i}" for i in range(8)])  # half a second refilled 5
    clock.now += 10.0  # quiet: the bucket refills to one second's worth, no more
    sink.output(0, "stdout", ["calm 0", "calm 1"])
    _finish(sink, 1)
    shown = [line.removeprefix("[rank 0] ") for line in out.getvalue().splitlines() if line.startswith("[rank 0]")]
    assert shown == [f"burst {i}" for i in range(10)] + [f"half {i}" for i in range(5)] + ["calm 0", "calm 1"]
    assert sum("more than 10 lines a second" in line for line in out.getvalue().splitlines()) == 1  # one notice per rank
    assert "18 of 35 lines held back" in out.getvalue() and "its last" not in out.getvalue()  # lines came after the held ones: no stale tail


def test_each_attempt_starts_with_a_full_budget_and_files_of_its_own(tmp_path: Path) -> None:
    sink, out, _ = _sink(tmp_path, Clock(), max_lines=2, max_rate=None)
    for attempt in range(2):
        sink.launch_started(1, attempt=attempt)
        sink.output(0, "stdout", [f"a{attempt} {i}" for i in range(4)])
        _finish(sink, 1)
    assert sink.logs is not None and sink.logs.folder is not None
    assert (sink.logs.folder / "rank0.attempt2.log").read_text().count("\n") == 4
    assert "[rank 0] a1 0" in out.getvalue() and "[rank 0] a1 1" in out.getvalue() and out.getvalue().count("2 of 4 lines held back") == 2


def test_a_launch_that_prints_nothing_makes_no_log_folder(tmp_path: Path) -> None:
    sink, _, _ = _sink(tmp_path, Clock(), max_lines=2, max_rate=None)
    for attempt in range(3):  # a pool's status, every second under --watch: it must not prune real launches' logs
        sink.launch_started(2, attempt=attempt)
        sink.event(0, {"type": "resources", "cpu": 1.0, "rss": 1, "peak_rss": 1})
        sink.event(1, {"type": "started", "pid": 123})  # a worker's chip says running: nothing to log
        sink.event(1, {"type": "progress", "bar": 0, "text": "  3%", "closed": False})  # an open bar is not logged either
        _finish(sink, 2)
    assert not (tmp_path / "logs").exists() or list((tmp_path / "logs").iterdir()) == []
    sink.launch_started(1, attempt=3)
    sink.output(0, "stdout", ["late"])
    _finish(sink, 1)
    assert sink.logs is not None and sink.logs.file_for(0) is not None and sink.logs.file_for(0).name == "rank0.attempt4.log"  # type: ignore[union-attr]
    assert sink.logs.file_for(0).read_text() == "late\n"  # type: ignore[union-attr]


def test_without_a_log_file_nothing_is_held_back(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the log root should be")
    out = io.StringIO()
    sink = RichTextSink(stdout=out, max_lines=1, log_root=blocked / "logs")
    sink.launch_started(1, attempt=0)
    sink.output(0, "stdout", ["one", "two", "three"])
    _finish(sink, 1)
    assert out.getvalue() == "[rank 0] one\n[rank 0] two\n[rank 0] three\n"  # the lines had nowhere else to go


def test_no_cap_by_default_and_no_logs_with_log_root_false(tmp_path: Path) -> None:
    assert RichTextSink().logs is None and not RichTextSink().cap.limited
    assert RichTextSink(max_lines=3, log_root=False).logs is None
    assert RichTextSink(log_root=tmp_path).logs is not None  # logs without a cap, if asked


def test_the_environment_sets_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "300, 40")
    assert from_env() == (300, 40.0)
    monkeypatch.setenv(ENV_VAR, "OFF")
    assert from_env() == (None, None)
    monkeypatch.setenv(ENV_VAR, "lots")
    with pytest.raises(ValueError, match=r"NBACCEL_TEXT_CAP='lots' is not LINES or LINES,RATE"):
        from_env()


def test_a_cap_batch_is_split_at_the_budget() -> None:
    cap = LineCap(max_lines=4, max_rate=None, tail=10, clock=Clock())
    assert cap.admit(3, "stdout", ["a", "b", "c"]) == (3, None)
    assert cap.admit(3, "stderr", ["d", "e"])[0] == 1 and cap.tail(3) == [("stderr", "e")]
    assert cap.admit(3, "stdout", ["f"]) == (0, None)  # the notice came once already


def loud(count: int, fail: bool) -> int:
    import os
    import sys

    rank = int(os.environ["RANK"])
    if rank == 1:
        write = sys.stdout.write
        for i in range(count):
            write(f"loud line {i}\n")
        if fail:
            sys.stdout.flush()
            raise RuntimeError("the loud rank broke")
    else:
        print("quiet rank", flush=True)
    return rank


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_real_launch_with_a_rank_printing_200000_lines(tmp_path: Path) -> None:
    out, err = io.StringIO(), io.StringIO()
    sink = RichTextSink(stdout=out, stderr=err, max_lines=2000, max_rate=500.0, log_root=tmp_path / "logs")
    assert notebook_launcher(loud, (200_000, False), num_processes=2, output=sink) == [0, 1]
    lines = out.getvalue().splitlines()
    shown = [line for line in lines if line.startswith("[rank 1] loud line")]
    assert len(shown) <= 2000 + 10 and "[rank 0] quiet rank" in lines
    assert shown[-1] == "[rank 1] loud line 199999"  # the rank's last line, at the end
    assert [line for line in lines if line.startswith("nbaccel: rank 1: more than")] != []
    assert assert_count(lines) == 200_000
    assert sink.logs is not None and sink.logs.folder is not None
    log = (sink.logs.folder / "rank1.log").read_text().splitlines()
    assert log == [f"loud line {i}" for i in range(200_000)]  # every line, in order
    assert len(out.getvalue()) < 200_000  # the cell's share: a few thousand lines, not 200,000


def assert_count(lines: list[str]) -> int:
    """Lines shown plus lines held back, from the closing line: every line is accounted for."""
    summary = next(line for line in lines if line.startswith("nbaccel: rank 1:") and "held back from the cell, all in" in line)
    return int(summary.split(" of ")[1].split(" lines")[0].replace(",", ""))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_loud_failing_rank_keeps_its_traceback_and_last_output_in_full(tmp_path: Path) -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out, stderr=io.StringIO(), max_lines=100, max_rate=50.0, log_root=tmp_path / "logs")
    with pytest.raises(RankFailedError) as raised:
        notebook_launcher(loud, (50_000, True), num_processes=2, output=sink)
    error = raised.value
    assert error.rank == 1 and "the loud rank broke" in error.remote_traceback and "raise RuntimeError" in error.remote_traceback
    assert error.last_lines and error.last_lines[-1] == "loud line 49999"  # the error's own tail: never capped
    assert "loud line 49999" in str(error) and "Traceback on rank 1" in str(error)
    assert isinstance(sink, TextSink) and "[rank 1] loud line 49999" in out.getvalue()


def test_a_widget_view_that_broke_falls_back_to_capped_text_naming_the_views_log_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from nbaccel.output.fallback import TextFallback
    from nbaccel.output.logdir import RankLogSink
    from nbaccel.output.sinks import CollectingSink, TeeSink

    class Broken(CollectingSink):
        def output(self, rank: int, stream: str, lines: list[str]) -> None:
            raise RuntimeError("comm gone")

    monkeypatch.setenv(ENV_VAR, "5,0")
    logs = RankLogSink(tmp_path / "logs")
    sink = TeeSink(logs, TextFallback(Broken(), logs=logs))  # as WidgetSink is made: the logs first
    sink.launch_started(1, attempt=0)
    sink.output(0, "stdout", [f"l{i}" for i in range(50)])
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED, exitcode=0)])
    out = capsys.readouterr().out.splitlines()
    assert [line for line in out if line.startswith("[rank 0]")][:5] == [f"[rank 0] l{i}" for i in range(5)]
    assert f"45 of 50 lines held back from the cell, all in {logs.file_for(0)}" in "\n".join(out)
    assert logs.file_for(0) is not None and logs.file_for(0).read_text().count("\n") == 50  # type: ignore[union-attr]
