"""Choosing the sink: explicit modes, NBACCEL_OUTPUT, and auto-detection of widget frontends.

Imports internals (output, output.choose, output.sinks, output.text): it tests those units directly, below the public face.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from nbaccel.output import frontend
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import CollectingSink, Sink, TeeSink
from nbaccel.output.text import RichTextSink


class FakeCommManager:
    def __init__(self) -> None:
        self.targets: dict[str, Any] = {}

    def register_target(self, name: str, handler: Any) -> None:
        self.targets[name] = handler


class FakeKernel:
    """Just what the detection reads from ipykernel: a comm manager and the current request."""

    def __init__(self) -> None:
        self.comm_manager = FakeCommManager()
        self.parent: dict[str, Any] = {}

    def get_parent(self) -> dict[str, Any]:
        return self.parent


class FakeShell:
    def __init__(self) -> None:
        self.kernel = FakeKernel()


@pytest.fixture(autouse=True)
def fresh_detection() -> Iterator[None]:
    frontend.reset_for_tests()
    yield
    frontend.reset_for_tests()


def _cell(shell: FakeShell, **metadata: Any) -> None:
    shell.kernel.parent = {"header": {"msg_type": "execute_request"}, "metadata": metadata}


def test_explicit_modes_and_sinks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NBACCEL_OUTPUT", raising=False)
    assert isinstance(make_sink("text"), RichTextSink)
    sink = CollectingSink()
    assert make_sink(sink) is sink
    with pytest.raises(ValueError, match="unknown output 'fancy'; choose one of 'auto', 'text', 'widgets'"):
        make_sink("fancy")
    monkeypatch.setenv("NBACCEL_OUTPUT", "nope")
    with pytest.raises(ValueError, match="unknown NBACCEL_OUTPUT 'nope'"):
        make_sink(None)


def test_auto_and_widgets_without_a_kernel_mean_text(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("NBACCEL_OUTPUT", "auto")
    assert isinstance(make_sink(None), RichTextSink)
    assert isinstance(make_sink("widgets"), RichTextSink)
    assert "needs a Jupyter kernel" in capsys.readouterr().out  # a notice (nbaccel.launch.notices), on stdout


def test_a_frontend_that_opens_the_widget_control_comm_gets_widgets() -> None:
    shell = FakeShell()
    _cell(shell)  # loaded by a cell (%load_ext): silence proves nothing
    assert frontend.watch(shell)
    assert not frontend.widget_frontend_attached(shell)
    received = []
    handler = shell.kernel.comm_manager.targets[frontend.CONTROL_TARGET]
    import ipywidgets

    original = ipywidgets.Widget.handle_control_comm_opened
    try:
        ipywidgets.Widget.handle_control_comm_opened = classmethod(lambda cls, comm, msg: received.append(msg))  # type: ignore[method-assign]
        handler("comm", {"metadata": {"version": "1.0.0"}})
    finally:
        ipywidgets.Widget.handle_control_comm_opened = original  # type: ignore[method-assign]
    assert received, "the comm must still reach ipywidgets (widget state restore)"
    assert frontend.widget_frontend_attached(shell)


def test_jupyterlab_cell_metadata_means_widgets_when_the_watcher_came_late() -> None:
    shell = FakeShell()
    _cell(shell, cellId="abc")  # nbclient sends cellId only
    frontend.watch(shell)
    assert not frontend.widget_frontend_attached(shell)
    _cell(shell, deletedCells=[], recordTiming=False, cellId="abc")
    assert frontend.widget_frontend_attached(shell)


def test_a_watcher_from_kernel_start_trusts_its_silence() -> None:
    shell = FakeShell()
    frontend.watch(shell)  # no request in flight: installed while the kernel started
    _cell(shell, deletedCells=[], recordTiming=False)  # JupyterLab without the widgets extension
    assert not frontend.widget_frontend_attached(shell)


def test_the_watcher_wraps_a_handler_registered_before_it_and_comes_back_after_ipywidgets_replaces_it() -> None:
    shell = FakeShell()
    _cell(shell)
    seen = []
    targets = shell.kernel.comm_manager.targets
    targets[frontend.CONTROL_TARGET] = lambda comm, msg: seen.append("earlier")
    frontend.watch(shell)
    targets[frontend.CONTROL_TARGET]("comm", {})
    assert seen == ["earlier"] and frontend.widget_frontend_attached(shell)
    frontend.reset_for_tests()
    targets[frontend.CONTROL_TARGET] = lambda comm, msg: seen.append("ipywidgets")  # re-imported
    frontend.widget_frontend_attached(shell)
    targets[frontend.CONTROL_TARGET]("comm", {})
    assert seen[-1] == "ipywidgets" and frontend.widget_frontend_attached(shell)


def test_a_sink_written_before_the_protocol_had_ticks_is_used_without_them() -> None:
    class FiveCalls:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def launch_started(self, num_processes: int, attempt: int) -> None:
            pass

        def output(self, rank: int, stream: str, lines: list[str]) -> None:
            self.lines.extend(lines)

        def event(self, rank: int, event: dict[str, Any]) -> None:
            pass

        def rank_finished(self, outcome: Any) -> None:
            pass

        def launch_finished(self, outcomes: list[Any]) -> None:
            pass

    old = FiveCalls()
    sink = make_sink(old)  # type: ignore[arg-type]
    assert isinstance(sink, Sink) and sink.tick_in() is None
    sink.launch_started(2, 0)
    sink.output(1, "stdout", ["kept"])
    sink.tick()
    assert old.lines == ["kept"]
    with pytest.raises(TypeError, match="output must be one of .* or a Sink, got object"):
        make_sink(object())  # type: ignore[arg-type]


def test_a_tee_ticks_when_the_soonest_of_its_sinks_wants() -> None:
    class Wants(CollectingSink):
        def __init__(self, due: float | None) -> None:
            super().__init__()
            self.due, self.ticks = due, 0

        def tick_in(self) -> float | None:
            return self.due

        def tick(self) -> None:
            self.ticks += 1

    late, never, soon = Wants(0.5), Wants(None), Wants(0.1)
    tee = TeeSink(late, never, soon)
    assert tee.tick_in() == 0.1 and TeeSink(never).tick_in() is None
    tee.tick()
    tee.output(0, "stdout", ["to all"])
    assert [s.ticks for s in (late, never, soon)] == [1, 1, 1] and all(s.text(0) == ["to all"] for s in (late, never, soon))
