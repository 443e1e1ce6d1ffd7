"""WidgetSink without a kernel: chips and tab titles (the ranks taking part, lowest first), coalescing, static end view, logs.

Time is a fake clock: a test moves it on, and calls ``tick()`` where the kernel's event loop would.

Imports internals (launch.outcome, launch.sampler, wire.rich, output.choose, output.sinks, output.text, output.widgets.sink): it tests those units directly, below the public face.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest

from nbaccel.launch.outcome import RankOutcome, RemoteError, Status
from nbaccel.output.choose import WidgetSink
from nbaccel.output.sinks import CollectingSink, Sink, TextSink
from nbaccel.output.text import RichTextSink
from nbaccel.output.widgets.sink import WIDGET_VIEW_MIME
from tests.output.conftest import CommLog, FakeClock, FakePublisher

ERROR = RemoteError("ValueError", "boom", 'Traceback (most recent call last):\n  File "<cell>", line 3, in f\nValueError: boom\n', 1.0)


_MADE: list[WidgetSink] = []


@pytest.fixture(autouse=True)
def _end_every_launch() -> object:
    """End the launches a test left open, as the loop does, so their log folders unlock (the leak check sees fds)."""
    yield
    while _MADE:
        _MADE.pop().launch_finished([])


def _sink(publisher: FakePublisher, tmp_path: Path, clock: FakeClock | None = None, **kwargs: object) -> WidgetSink:
    options = {"publisher": publisher, "log_root": tmp_path / "logs", "clock": clock or FakeClock()}
    options.update(kwargs)
    _MADE.append(WidgetSink(**options))  # type: ignore[arg-type]
    return _MADE[-1]


def _tab(comms: CommLog):
    (tab,) = comms.of("TabModel")
    return tab


def _titles(comms: CommLog) -> list[str]:
    tab = _tab(comms)
    updates = tab.updates("titles")
    return list(updates[-1] if updates else tab.data["state"]["titles"])


def test_the_launch_shows_one_widget_with_rank_0_first_and_selected(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(4, attempt=0)
    ((kind, bundle, _),) = publisher.calls
    assert kind == "show"
    assert bundle[WIDGET_VIEW_MIME]["model_id"] == sink.live.view.root.model_id
    assert "text/plain" in bundle
    tab = _tab(comms)
    assert tab.data["state"]["selected_index"] == 0
    assert list(tab.data["state"]["titles"]) == ["rank 0 · waiting", "rank 1 · waiting", "rank 2 · waiting", "rank 3 · waiting"]
    children = list(tab.data["state"]["children"])
    assert children == [f"IPY_MODEL_{p.widget.model_id}" for p in sink.live.view.panels.values()]
    sink.launch_finished([RankOutcome(r, Status.SUCCEEDED, exitcode=0) for r in range(4)])


OUTCOMES = [
    (RankOutcome(1, Status.SUCCEEDED, exitcode=0), "rank 1 · done", "rank 1 · done"),
    (RankOutcome(1, Status.FAILED, exitcode=1, error=ERROR), "rank 1 · failed (ValueError)", "rank 1 · failed: ValueError, exit code 1"),
    (RankOutcome(1, Status.EXITED, exitcode=3), "rank 1 · failed (exit 3)", "rank 1 · failed: exited with code 3 without returning"),
    (RankOutcome(1, Status.EXITED, signal=15), "rank 1 · failed (SIGTERM)", "rank 1 · failed: killed by SIGTERM after returning"),
    (RankOutcome(1, Status.SIGNALED, signal=11), "rank 1 · failed (SIGSEGV)", "rank 1 · failed: killed by SIGSEGV"),
    (RankOutcome(1, Status.STOPPED, signal=15), "rank 1 · stopped", "rank 1 · stopped by nbaccel after another rank failed (SIGTERM)"),
    (RankOutcome(1, Status.INTERRUPTED, exitcode=130), "rank 1 · interrupted", "rank 1 · interrupted (kernel interrupt)"),
    (RankOutcome(1, Status.TIMED_OUT, signal=15), "rank 1 · timed out", "rank 1 · stopped: the launch's timeout passed"),
]


def _chip(sink: WidgetSink, rank: int) -> str:
    """Rank ``rank``'s chip as the frontend has it in the chip row (its panel's first line repeats it)."""
    row = sink.live.view.chip_row.value
    (chip,) = [part for part in row.split("<span class='nbaccel-chip' ")[1:] if part.startswith(f"data-rank='{rank}'")]
    assert f"data-rank='{rank}'" in sink.live.view.panels[rank].header.value
    return chip


@pytest.mark.parametrize(("outcome", "title", "chip"), OUTCOMES, ids=[f"{o[0].status.name}-{o[1].split('(')[-1].rstrip(')')}" for o in OUTCOMES])
def test_chip_and_tab_title_say_how_a_rank_ended_in_words(
    comms: CommLog, publisher: FakePublisher, tmp_path: Path, outcome: RankOutcome, title: str, chip: str
) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(2, attempt=0)
    sink.event(1, {"type": "started", "pid": 1})
    assert _titles(comms) == ["rank 0 · waiting", "rank 1 · running"]
    sink.rank_finished(outcome)
    assert _titles(comms)[1] == title
    chip_html = _chip(sink, 1)
    assert chip in chip_html.replace("&#x27;", "'")
    assert chip in sink.live.view.panels[1].header.value.replace("&#x27;", "'")  # the panel says it too (no Tab titles in VS Code)
    if outcome.is_failure:
        assert (
            sink.live.view.banner.value
            and f"rank 1 {chip.split('· ', 1)[1]}" in sink.live.view.banner.value.replace("&#x27;", "'")
            or "ValueError: boom" in sink.live.view.banner.value
        )
    sink.rank_finished(RankOutcome(0, Status.SUCCEEDED, exitcode=0))
    assert sink.tick_in() == 0.0
    sink.tick()
    assert publisher.final  # the last rank ending finishes the view at the next tick, launch_finished or not


def test_output_is_coalesced_to_one_push_per_interval_and_no_line_is_lost(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    clock = FakeClock()
    sink = _sink(publisher, tmp_path, clock, interval=0.2, max_lines=100_000)
    sink.launch_started(2, attempt=0)
    for i in range(1000):
        sink.output(0, "stdout", [f"line {i}"])
        clock.advance(0.0001)  # 1000 lines in 0.1 s: all within one interval
    pushes = sum(len(c.updates("outputs")) + (1 if c.data.get("state", {}).get("outputs") else 0) for c in comms.of("OutputModel"))
    assert pushes == 1  # the first line goes out at once; the rest waits for the interval
    clock.advance(0.11)
    sink.tick()
    shown = [line for b in sink.live.view.panels[0].blocks for o in b.outputs for line in o["text"].splitlines()]
    assert shown == [f"line {i}" for i in range(1000)]
    last = sink.live.view.panels[0].blocks[-1].widget
    assert last is not None and last.outputs[-1]["text"].endswith("line 999\n")
    messages = sum(len(c.sent) + 1 for c in comms.of("OutputModel"))
    assert messages <= len(sink.live.view.panels[0].blocks) + 3  # a comm_open per block and about one update
    sink.launch_finished([RankOutcome(r, Status.SUCCEEDED, exitcode=0) for r in range(2)])


def test_a_tick_pushes_lines_that_arrive_just_before_a_quiet_spell_and_moves_the_clock(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    clock = FakeClock()
    sink = _sink(publisher, tmp_path, clock, interval=0.05)
    threads = threading.active_count()
    sink.launch_started(1, attempt=0)
    assert threading.active_count() == threads  # no clock of its own: the kernel's event loop ticks it
    sink.output(0, "stdout", ["first"])
    sink.output(0, "stdout", ["second"])  # within the interval: not pushed by this call

    def sent() -> list[str]:
        return [o["text"] for c in comms.of("OutputModel") for u in [c.data["state"].get("outputs", []), *c.updates("outputs")] for o in u]

    assert sent()[-1] == "first\n"
    assert sink.tick_in() == pytest.approx(0.05)
    sink.tick()  # a tick before it is due does nothing
    assert sent()[-1] == "first\n"
    clock.advance(0.05)
    assert sink.tick_in() == 0.0
    sink.tick()
    assert sent()[-1] == "first\nsecond\n"
    assert sink.tick_in() == pytest.approx(0.95)  # nothing held: only the elapsed time is due
    clock.advance(0.95)
    sink.tick()
    assert "running · 1.0 s" in sink.live.view.clock.value
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED, exitcode=0)])
    assert sink.tick_in() is None


def test_the_end_replaces_the_widget_by_a_static_view_rank_0_first_and_closes_the_widgets(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(3, attempt=0)
    for rank in (2, 1, 0):  # arrival order does not decide the order shown
        sink.output(rank, "stdout", [f"hello from {rank}"])
    sink.event(
        0,
        {
            "type": "display",
            "data": {"text/html": "<table><tr><td>df</td></tr></table>", "text/plain": "df"},
            "metadata": {},
            "display_id": None,
            "update": False,
        },
    )
    sink.event(
        0,
        {
            "type": "progress",
            "bar": 0,
            "n": 10,
            "total": 10,
            "left": "train: 100%",
            "right": "10/10",
            "text": "train: 100%|##########| 10/10",
            "closed": True,
            "leave": True,
            "failed": False,
        },
    )
    sink.rank_finished(RankOutcome(2, Status.FAILED, exitcode=1, error=ERROR))
    sink.rank_finished(RankOutcome(1, Status.STOPPED, signal=15))
    sink.rank_finished(RankOutcome(0, Status.SUCCEEDED, exitcode=0))
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED), RankOutcome(1, Status.STOPPED), RankOutcome(2, Status.FAILED)])
    final = publisher.final
    assert set(final) == {"application/vnd.nbaccel.ranks+json", "text/html", "text/plain"}  # no widget view: nothing says "model not found" later
    assert publisher.calls[0][2] == publisher.calls[-1][2]
    plain, page = final["text/plain"], final["text/html"]
    assert plain.index("── rank 0 · done") < plain.index("── rank 1 · stopped") < plain.index("── rank 2 · failed (ValueError)")
    assert "hello from 0" in plain and "train: 100%|##########| 10/10" in plain
    assert re.search(r"<details open><summary><b>rank 0 · done", page)
    assert re.search(r"<details open><summary><b>✗ rank 2 · failed \(ValueError\)</b></summary>\n<pre[^>]*>rank 2 failed: ValueError: boom", page)
    assert "<details><summary><b>rank 1 · stopped" in page
    assert "<table><tr><td>df</td></tr></table>" in page
    assert "failed after" in plain.splitlines()[0]
    assert all(c.closed for c in comms)


def test_every_line_goes_to_the_ranks_log_file_even_beyond_the_cap(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path, max_lines=10)
    sink.launch_started(2, attempt=0)
    sink.output(1, "stdout", [f"l{i}" for i in range(500)])
    sink.event(1, {"type": "display", "data": {"text/plain": "<Figure size 640x480 with 1 Axes>"}, "metadata": {}, "display_id": None, "update": False})
    sink.launch_finished([RankOutcome(r, Status.SUCCEEDED, exitcode=0) for r in range(2)])
    log = Path(sink.live.view.panels[1].log_file)
    assert log.parent.parent == tmp_path / "logs"
    assert log.read_text().splitlines() == [f"l{i}" for i in range(500)] + ["<Figure size 640x480 with 1 Axes>"]
    assert str(log) in publisher.final["text/plain"]


def test_a_restarted_launch_gets_a_view_and_log_files_per_attempt(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    for attempt in range(2):
        sink.launch_started(1, attempt=attempt)
        sink.output(0, "stdout", [f"attempt {attempt}"])
        sink.launch_finished([RankOutcome(0, Status.EXITED, exitcode=2)])
    shows = [c for c in publisher.calls if c[0] == "show"]
    assert len(shows) == 2 and shows[0][2] != shows[1][2]
    folder = Path(sink.live.view.log_dir)
    assert (folder / "rank0.log").read_text() == "attempt 0\n"
    assert (folder / "rank0.attempt2.log").read_text() == "attempt 1\n"
    assert "attempt 2" in publisher.final["text/plain"].splitlines()[0]


def test_calls_after_the_end_are_ignored(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(1, attempt=0)
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED, exitcode=0)])
    calls = len(publisher.calls)
    sink.output(0, "stdout", ["late"])
    sink.rank_finished(RankOutcome(0, Status.SUCCEEDED, exitcode=0))
    sink.launch_finished([])
    assert len(publisher.calls) == calls


def test_many_launches_leave_no_widgets_behind(publisher: FakePublisher, tmp_path: Path) -> None:
    from ipywidgets.widgets.widget import _instances

    before = len(_instances)
    for _ in range(5):
        sink = _sink(publisher, tmp_path, max_lines=5)
        sink.launch_started(2, attempt=0)
        sink.output(0, "stdout", [str(i) for i in range(50)])
        sink.event(1, {"type": "progress", "bar": 0, "n": 1, "total": 2, "left": "", "right": "", "text": "", "closed": False, "leave": True, "failed": False})
        sink.tick()
        sink.launch_finished([RankOutcome(r, Status.SUCCEEDED, exitcode=0) for r in range(2)])
    assert len(_instances) == before


def test_a_broken_view_never_breaks_the_launch_the_rest_goes_out_as_text(
    comms: CommLog, publisher: FakePublisher, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(2, attempt=0)
    sink.output(0, "stdout", ["shown in the widget"])

    def broken(stream: str, lines: list[str]) -> None:
        raise RuntimeError("comm gone")

    sink.live.view.panels[1].add_lines = broken  # type: ignore[method-assign]
    sink.output(1, "stdout", ["after the failure"])
    sink.output(0, "stdout", ["still text"])
    sink.launch_finished([RankOutcome(r, Status.SUCCEEDED, exitcode=0) for r in range(2)])
    notice, *lines = capsys.readouterr().out.splitlines()  # nbaccel's notices go to stdout (nbaccel.launch.notices)
    assert notice.startswith("nbaccel: the live widget view failed (RuntimeError: comm gone); the rest of this launch is shown as text")
    assert lines == ["[rank 1] after the failure", "[rank 0] still text"]


def test_a_view_that_breaks_in_a_tick_falls_back_to_text_and_its_logs_go_on(
    comms: CommLog, publisher: FakePublisher, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = FakeClock()
    sink = _sink(publisher, tmp_path, clock)
    sink.launch_started(1, attempt=0)
    sink.output(0, "stdout", ["pushed at once"])
    sink.output(0, "stdout", ["held"])

    def broken() -> None:
        raise RuntimeError("comm gone")

    sink.live.view.panels[0].sync = broken  # type: ignore[method-assign]
    clock.advance(1.0)
    sink.tick()  # what the kernel's event loop calls: it must not raise into the launch
    assert sink.fallback.failed and sink.tick_in() is None  # text needs no ticks
    sink.output(0, "stdout", ["after the failure"])
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED, exitcode=0)])
    notice, *lines = capsys.readouterr().out.splitlines()
    assert "the live widget view failed (RuntimeError: comm gone)" in notice
    assert lines == ["[rank 0] after the failure"]
    assert sink.logs is not None and sink.logs.folder is not None
    assert (sink.logs.folder / "rank0.log").read_text().splitlines() == ["pushed at once", "held", "after the failure"]


def test_without_logs_the_view_names_no_log_files(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path, log_root=False, max_lines=3)
    assert sink.sinks == (sink.fallback,)
    sink.launch_started(1, attempt=0)
    sink.output(0, "stdout", [f"l{i}" for i in range(10)])
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED, exitcode=0)])
    plain = publisher.final["text/plain"]
    assert "full logs" not in plain and "earlier lines not shown" in plain and "the full log is in" not in plain
    assert not (tmp_path / "logs").exists()


def test_tick_in_says_when_held_lines_are_due_for_a_caller_that_drives_the_ticks(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    clock = FakeClock()
    sink = _sink(publisher, tmp_path, clock, interval=0.5)
    sink.launch_started(1, attempt=0)
    clock.advance(0.25)
    assert sink.tick_in() == pytest.approx(0.75)  # nothing held: only the clock
    sink.output(0, "stdout", ["pushed at once"])
    sink.output(0, "stdout", ["held"])
    assert sink.tick_in() == pytest.approx(0.5)
    clock.advance(sink.tick_in())
    sink.tick()
    assert sink.live.view.panels[0].blocks[-1].widget.outputs[-1]["text"].endswith("held\n")
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED, exitcode=0)])
    assert sink.tick_in() is None


def test_a_cell_on_some_ranks_shows_exactly_those_labelled_with_their_true_numbers(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(4, attempt=0, ranks=[3, 1])  # persistent workers: %%distributed --ranks 1,3
    tab = _tab(comms)
    assert _titles(comms) == ["rank 1 · waiting", "rank 3 · waiting"] and tab.data["state"]["selected_index"] == 0
    assert [_chip(sink, r).split("· ")[0][-7:] for r in (1, 3)] == ["rank 1 ", "rank 3 "]
    assert "data-rank='0'" not in sink.live.view.chip_row.value
    assert "ranks 1, 3 of 4" in sink.live.view.title.value and "ranks 1, 3 of 4 running" in publisher.calls[0][1]["text/plain"]
    sink.event(3, {"type": "started", "pid": 13})
    sink.output(3, "stdout", ["from rank 3"])
    sink.rank_finished(RankOutcome(3, Status.SUCCEEDED, exitcode=0))
    assert _titles(comms) == ["rank 1 · waiting", "rank 3 · done"] and not sink.live.finished
    sink.rank_finished(RankOutcome(1, Status.SUCCEEDED, exitcode=0))
    sink.tick()
    plain, page = publisher.final["text/plain"], publisher.final["text/html"]  # both ranks ended: the view did
    assert plain.splitlines()[0].startswith("nbaccel: ranks 1, 3 of 4, done in")
    assert plain.index("── rank 1 · done") < plain.index("── rank 3 · done") and "rank 0" not in plain and "rank 2" not in plain
    assert "<details open><summary><b>rank 1 · done" in page and "<details><summary><b>rank 3 · done" in page
    assert sink.live.view.panels[3].log_file.endswith("rank3.log") and not sink.fallback.failed


def test_a_rank_that_was_not_announced_gets_a_tab_in_rank_order_and_the_selection_stays(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(4, attempt=0, ranks=[1, 3])
    sink.live.view.tabs.selected_index = 1  # the user looks at rank 3
    sink.output(0, "stdout", ["an idle worker's thread printed"])
    assert _titles(comms) == ["rank 0 · running", "rank 1 · waiting", "rank 3 · waiting"]
    assert sink.live.view.tabs.selected_index == 2  # still rank 3
    sink.rank_finished(RankOutcome(1, Status.SUCCEEDED, exitcode=0))
    sink.rank_finished(RankOutcome(3, Status.SUCCEEDED, exitcode=0))
    sink.tick()
    plain = publisher.final["text/plain"]  # the ranks taking part ended, so the launch did
    assert "done in" in plain.splitlines()[0] and "an idle worker's thread printed" in plain


def test_lines_read_after_the_last_answer_are_in_the_static_view(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(2, attempt=0, ranks=[1])
    sink.rank_finished(RankOutcome(1, Status.SUCCEEDED))  # a worker's answer comes on its channel, read first ...
    sink.output(1, "stdout", ["printed just before answering"])  # ... then its stdout, in the same wake-up
    sink.tick()
    assert "printed just before answering" in publisher.final["text/plain"]


def test_the_text_sinks_accept_the_ranks_taking_part() -> None:
    collecting = CollectingSink()
    collecting.launch_started(4, 0, ranks=[1, 3])
    assert collecting.ranks == [1, 3]
    collecting.launch_started(2, 1)
    assert collecting.ranks == [0, 1] and collecting.attempts == 2
    for sink in (TextSink(), RichTextSink()):
        sink.launch_started(4, 0, ranks=[2])
        assert isinstance(sink, Sink)


def test_a_ranks_chip_shows_its_sampled_use_live_and_the_static_view_its_peak(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = _sink(publisher, tmp_path)
    sink.launch_started(2, attempt=0)
    sink.output(1, "stdout", ["working"])
    sink.event(1, {"type": "resources", "cpu": 97.4, "rss": 3 * 2**29, "peak_rss": 2**31})
    chip = _chip(sink, 1)
    assert "rank 1 · running" in chip and "cpu 97% · 1.5 GiB" in chip
    assert sink.live.view.states[1].short == "running"  # a sample is no output: the state is unchanged
    sink.rank_finished(RankOutcome(0, Status.SUCCEEDED, exitcode=0))
    sink.rank_finished(RankOutcome(1, Status.SUCCEEDED, exitcode=0))
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED), RankOutcome(1, Status.SUCCEEDED)])
    final = publisher.final
    assert "── rank 1 · done · peak 2.0 GiB ──" in final["text/plain"]
    assert "peak 2.0 GiB" in final["text/html"]
    ranks = {r["rank"]: r for r in final["application/vnd.nbaccel.ranks+json"]["ranks"]}
    assert ranks[1]["peak_rss"] == 2**31 and ranks[0]["peak_rss"] is None


def test_a_gpu_ranks_chip_shows_its_device_memory_and_utilisation_from_real_samples(
    comms: CommLog, publisher: FakePublisher, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess
    import sys

    from nbaccel.launch.sampler import ResourceSampler
    from nbaccel.wire.rich import resources_event
    from tests.devices.fakes import build_fake_nvml, write_use

    monkeypatch.setenv("NBACCEL_NVML_LIBRARY", str(build_fake_nvml(tmp_path / "nvml")))
    monkeypatch.setenv("FAKE_NVML_GPUS", "NVIDIA H200|GPU-aa01|9|0|")
    monkeypatch.setenv("FAKE_NVML_USE", str(tmp_path / "use.txt"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sampler = ResourceSampler({1: child.pid}, now=0.0, gpus={1: 0})
        write_use(tmp_path / "use.txt", {0: {child.pid: 5 * 2**30}}, {0: 88})
        first = sampler.sample(1.0)[1]
        write_use(tmp_path / "use.txt", {0: {child.pid: 2**30}}, {0: 12})
        second = sampler.sample(2.0)[1]
    finally:
        child.kill()
        child.wait()
    sink = _sink(publisher, tmp_path)
    sink.launch_started(2, attempt=0)
    sink.event(1, resources_event(first))
    assert "gpu 5.0 GiB 88%" in _chip(sink, 1)
    sink.event(1, resources_event(second))
    assert "gpu 1.0 GiB 12%" in _chip(sink, 1)
    sink.rank_finished(RankOutcome(0, Status.SUCCEEDED, exitcode=0))
    sink.rank_finished(RankOutcome(1, Status.SUCCEEDED, exitcode=0))
    sink.launch_finished([RankOutcome(0, Status.SUCCEEDED), RankOutcome(1, Status.SUCCEEDED)])
    final = publisher.final
    assert "── rank 1 · done · peak " in final["text/plain"] and " · gpu peak 5.0 GiB ──" in final["text/plain"]
    assert "gpu peak 5.0 GiB" in final["text/html"]
    ranks = {r["rank"]: r for r in final["application/vnd.nbaccel.ranks+json"]["ranks"]}
    assert ranks[1]["peak_gpu_mem"] == 5 * 2**30 and ranks[0]["peak_gpu_mem"] is None
