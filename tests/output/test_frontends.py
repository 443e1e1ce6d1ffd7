"""Which frontend runs the cell, and the pace the live view keeps in it.

Detection is checked against stand-ins for what each frontend leaves in the kernel: VS Code's
cell URIs, Colab's ``google.colab`` module, Kaggle's documented environment variables, the
classic Notebook's silent cells after its widget manager opened the control comm. The pace is
checked on the real widgets (ipywidgets, every comm recorded) under a fake clock: four loud ranks
for five seconds, messages counted per second.

Imports internals (output, output.choose, output.update_policy, output.widgets.sink): it tests those units directly.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbaccel.launch.outcome import RankOutcome, RemoteError, Status
from nbaccel.output import frontend
from nbaccel.output.choose import WidgetSink, make_sink
from nbaccel.output.text import RichTextSink
from nbaccel.output.update_policy import CAPPED_RATE, MessageBudget, UpdatePolicy, policy_for
from tests.output.conftest import CommLog, FakeClock, FakePublisher
from tests.output.test_frontend_vscode import VSCODE_CELL, FakeShell

LAB_CELL = {"deletedCells": [], "recordTiming": False, "cellId": "8f3b2c1e-4d5a-4b6c-9e7f-0a1b2c3d4e5f"}


@pytest.fixture(autouse=True)
def fresh_detection() -> Iterator[None]:
    frontend.reset_for_tests()
    yield
    frontend.reset_for_tests()


def _seen(shell: FakeShell) -> None:
    """A widget manager opens the control comm (what JupyterLab, VS Code and nbclassic do on connect)."""
    import ipywidgets

    handler = shell.kernel.comm_manager.targets[frontend.CONTROL_TARGET]
    original = ipywidgets.Widget.handle_control_comm_opened
    try:
        ipywidgets.Widget.handle_control_comm_opened = classmethod(lambda cls, comm, msg: None)  # type: ignore[method-assign]
        handler("comm", {"metadata": {"version": "1.0.0"}})
    finally:
        ipywidgets.Widget.handle_control_comm_opened = original  # type: ignore[method-assign]


def _detect(shell: FakeShell, **environ: str) -> frontend.Frontend:
    return frontend.detect(shell, environ=environ)


def test_vscode_is_told_by_its_cell_uri_and_gets_the_capped_pace() -> None:
    shell = FakeShell().cell(cellId=VSCODE_CELL)
    frontend.watch(shell)
    found = _detect(shell)
    assert (found.name, found.widgets) == ("vscode", True) and "vscode-notebook-cell:" in found.evidence
    assert policy_for(found.name).view_rate == CAPPED_RATE


def test_vscode_pid_alone_is_no_evidence_but_names_a_widget_frontend_that_opened_the_control_comm() -> None:
    shell = FakeShell().cell()
    frontend.watch(shell)
    assert _detect(shell, VSCODE_PID="4242").name == "none"  # e.g. nbclient run from VS Code's terminal
    _seen(shell)
    assert _detect(shell, VSCODE_PID="4242").name == "vscode"
    assert _detect(shell).name == "classic"  # the same, without VS Code's variable


def test_a_jupyterlab_cell_in_vscodes_terminal_is_jupyterlab() -> None:
    shell = FakeShell().cell(**LAB_CELL)
    frontend.watch(shell)
    _seen(shell)
    assert _detect(shell, VSCODE_PID="4242").name == "jupyterlab"
    assert policy_for("jupyterlab") == UpdatePolicy("jupyterlab")  # as before this change: no view-wide cap


def test_colab_is_told_by_its_module(monkeypatch: pytest.MonkeyPatch) -> None:
    shell = FakeShell().cell()  # Colab's cells carry none of JupyterLab's metadata
    frontend.watch(shell)
    assert _detect(shell).name == "none"
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    found = _detect(shell)
    assert (found.name, found.widgets) == ("colab", True) and policy_for("colab").view_rate == CAPPED_RATE


@pytest.mark.parametrize(
    ("environ", "widgets"),
    [
        ({"KAGGLE_KERNEL_RUN_TYPE": "Interactive", "KAGGLE_URL_BASE": "https://www.kaggle.com"}, True),
        ({"KAGGLE_URL_BASE": "https://www.kaggle.com"}, True),
        ({"KAGGLE_KERNEL_RUN_TYPE": "Batch", "KAGGLE_URL_BASE": "https://www.kaggle.com"}, False),  # "Save & Run All"
    ],
    ids=["editor", "url-only", "commit-run"],
)
def test_kaggle_is_told_by_its_variables(environ: dict[str, str], widgets: bool) -> None:
    shell = FakeShell().cell()
    frontend.watch(shell)
    found = _detect(shell, **environ)
    assert (found.name, found.widgets) == ("kaggle", widgets)


def test_the_classic_notebook_is_told_only_by_a_watcher_from_kernel_start() -> None:
    shell = FakeShell()
    frontend.watch(shell)  # nbaccel in IPython's `extensions`: installed before any request
    _seen(shell)  # nbclassic's widget manager opens the control comm on connect
    found = _detect(shell.cell())  # and sends no cell metadata at all
    assert (found.name, found.widgets) == ("classic", True) and policy_for("classic").view_rate is None


def test_unknown_frontends_and_no_kernel_get_text() -> None:
    shell = FakeShell().cell(cellId="file:///somewhere")
    frontend.watch(shell)
    assert _detect(shell) == frontend.Frontend("none", False, _detect(shell).evidence)
    assert frontend.detect(None).name == "none"  # plain Python: no kernel


def test_a_launch_from_another_thread_gets_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Widget updates sent from a thread are not rendered in Colab (colabtools #3373): text instead.
    monkeypatch.setattr(frontend, "in_kernel", lambda shell=None: True)
    monkeypatch.setattr(frontend, "detect", lambda shell=None, environ=None: frontend.Frontend("jupyterlab", True, "stand-in"))
    made: list[object] = []
    thread = threading.Thread(target=lambda: made.extend([make_sink("widgets"), make_sink("auto")]))
    thread.start()
    thread.join()
    assert [type(s) for s in made] == [RichTextSink, RichTextSink]
    assert "from a thread other than the kernel's main one" in capsys.readouterr().out


def test_make_sink_gives_the_widget_view_the_detected_frontends_pace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NBACCEL_LOG_DIR", str(tmp_path))
    monkeypatch.setattr(frontend, "detect", lambda shell=None, environ=None: frontend.Frontend("colab", True, "stand-in"))
    sink = make_sink("auto")
    assert isinstance(sink, WidgetSink) and sink.live.policy.view_rate == CAPPED_RATE and sink.live.max_lines == 200
    assert WidgetSink(max_lines=1000, log_root=False).live.max_lines == 1000  # an explicit cap wins


def test_the_budget_overdraws_once_and_waits_the_debt_off() -> None:
    budget = MessageBudget(rate=10.0, now=0.0)
    assert budget.ready(0.0)
    budget.spend(5)
    assert not budget.ready(0.3) and budget.wait(0.3) == pytest.approx(0.2)
    assert budget.ready(0.5) and budget.spent == 5
    assert MessageBudget(10.0, 0.0).wait(100.0) == 0.0  # the bucket holds at most `burst`
    with pytest.raises(ValueError, match="view_rate must be a positive number"):
        UpdatePolicy("x", view_rate=0)


# -- the pace, on real widgets -------------------------------------------------------------------


def _messages(comms: CommLog) -> int:
    """Every widget message so far: opens, updates and closes."""
    return len(comms) + comms.messages() + sum(c.closed for c in comms)


def _loud_run(comms: CommLog, publisher: FakePublisher, tmp_path: Path, policy: UpdatePolicy, ranks: int = 4, seconds: int = 5) -> dict[str, Any]:
    """``ranks`` ranks printing 50 lines every 10 ms (and sampled once a second) for ``seconds``,
    driven as the event loop drives a sink; widget messages counted per second."""
    clock = FakeClock()
    sink = WidgetSink(publisher=publisher, log_root=tmp_path / "logs", clock=clock, policy=policy)
    sink.launch_started(ranks, attempt=0)
    at_start = _messages(comms)
    per_second, counted, sent = [], at_start, 0
    for step in range(seconds * 100):
        for rank in range(ranks):
            sink.output(rank, "stdout", [f"r{rank} line {sent + i}" for i in range(50)])
            if step % 100 == 0:
                sink.event(rank, {"type": "resources", "cpu": float(step % 97), "rss": (step + 1) * 2**20, "peak_rss": 2**30})
        sent += 50
        due = sink.tick_in()
        if due is not None and due <= 0.0:
            sink.tick()
        clock.advance(0.01)
        if step % 100 == 99:
            total = _messages(comms)
            per_second.append(total - counted)
            counted = total
    sink.rank_finished(RankOutcome(ranks - 1, Status.FAILED, exitcode=1, error=RemoteError("ValueError", "boom", "Traceback\nValueError: boom\n", 1.0)))
    failed_chip_at = clock.now
    while "failed" not in sink.live.view.chip_row.value and clock.now < failed_chip_at + 2:
        clock.advance(0.01)
        for rank in range(ranks - 1):
            sink.output(rank, "stdout", ["more"])
        due = sink.tick_in()
        if due is not None and due <= 0.0:
            sink.tick()
    chip_delay = clock.now - failed_chip_at
    for rank in range(ranks - 1):
        sink.rank_finished(RankOutcome(rank, Status.STOPPED))
    sink.launch_finished([])
    logs = [(tmp_path / "logs").glob(f"*/rank{r}.log") for r in range(ranks)]
    return {"per_second": per_second, "start": at_start, "lines": sent, "chip_delay": chip_delay, "final": publisher.final, "logs": logs}


def test_vscode_and_colab_get_about_10_widget_messages_a_second_for_the_whole_view(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    run = _loud_run(comms, publisher, tmp_path, policy_for("vscode"))
    # The first second also holds the view's own opens (counted apart, in `start`); then at
    # most the rate, plus the one push a budget may overdraw by.
    assert max(run["per_second"]) <= CAPPED_RATE + 4, run["per_second"]
    assert sum(run["per_second"]) <= CAPPED_RATE * len(run["per_second"]) + 4, run["per_second"]
    assert min(run["per_second"]) >= 5, run["per_second"]  # and it keeps showing output meanwhile
    assert run["chip_delay"] <= 0.5  # a failure's words go first, loud panels or not
    plain = run["final"]["text/plain"]
    assert f"r0 line {run['lines'] - 1}" in plain and "earlier lines not shown" in plain  # the newest lines, and what was dropped
    for found in run["logs"]:
        (log,) = list(found)
        assert len(log.read_text().splitlines()) >= run["lines"]  # nothing lost from the log files


def test_jupyterlab_keeps_its_pace_of_each_panel_every_50_ms(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    run = _loud_run(comms, publisher, tmp_path, policy_for("jupyterlab"), seconds=2)
    assert min(run["per_second"]) >= 4 * 20, run["per_second"]  # four panels, 20 pushes a second each
    assert run["chip_delay"] == 0.0


def test_every_panel_names_its_rank_and_state_in_its_own_content(comms: CommLog, publisher: FakePublisher, tmp_path: Path) -> None:
    sink = WidgetSink(publisher=publisher, log_root=tmp_path / "logs", clock=FakeClock(), policy=policy_for("vscode"))
    sink.launch_started(3, attempt=0, ranks=None)
    for rank, panel in sink.live.view.panels.items():
        assert panel.widget.children[0] is panel.header  # the first thing in the tab's page
        assert f"rank {rank} · waiting to start" in panel.header.value
    sink.launch_finished([])
