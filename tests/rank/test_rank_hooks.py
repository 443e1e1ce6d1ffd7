"""Rank hooks in real ranks (fork and spawn): display(), figures, tqdm and widgets become events.

Imports internals (rank, wire): it tests those units directly, below the public face.
"""

from __future__ import annotations

import sys
from typing import Any

import pytest

import nbaccel
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(90)


def _launch(function: Any, args: tuple = (), start_method: str = "fork", num_processes: int = 2) -> CollectingSink:
    sink = CollectingSink()
    nbaccel.notebook_launcher(function, args, num_processes=num_processes, start_method=start_method, output=sink, cpu=True)
    return sink


def _of(sink: CollectingSink, rank: int, kind: str) -> list[dict]:
    return [e for e in sink.events.get(rank, []) if e["type"] == kind]


def rich_rank() -> None:
    from IPython.display import HTML, clear_output, display
    from tqdm.auto import tqdm

    display(HTML("<b>rich</b>"), metadata={"isolated": True})
    for _ in tqdm(range(30), desc="train", mininterval=0):
        pass
    clear_output(wait=True)
    print("plain line")


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_display_and_tqdm_become_events_not_text(start_method: str) -> None:
    sink = _launch(rich_rank, start_method=start_method)
    for rank in (0, 1):
        kinds = [e["type"] for e in sink.events[rank]]
        assert kinds[0] == "started"
        (shown,) = _of(sink, rank, "display")
        assert shown["data"]["text/html"] == "<b>rich</b>" and shown["metadata"] == {"isolated": True}
        bars = _of(sink, rank, "progress")
        assert 2 <= len(bars) <= 31 and {b["bar"] for b in bars} == {bars[0]["bar"]}
        assert bars[-1]["closed"] and bars[-1]["n"] == 30 and not bars[-1]["failed"]
        assert bars[-1]["left"].startswith("train: 100%") and "30/30" in bars[-1]["right"]
        assert _of(sink, rank, "clear_output") == [{"type": "clear_output", "wait": True}]
        assert sink.text(rank) == ["plain line"]  # no bar redrawn into stderr


def figure_rank() -> None:
    import matplotlib.pyplot as plt

    plt.plot([0, 1], [1, 0])
    plt.show()


@pytest.mark.slow
def test_a_matplotlib_figure_from_the_inline_backend_is_a_display_with_a_png(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")  # what ipykernel sets
    sink = _launch(figure_rank, num_processes=1)
    (figure,) = _of(sink, 0, "display")
    assert figure["data"]["image/png"].startswith("iVBOR") and "Figure" in figure["data"]["text/plain"]


def bar_class_rank(bar_class: Any) -> bool:
    import sys

    for _ in bar_class(range(5), mininterval=0):
        pass
    return "ipywidgets" in sys.modules and bool(getattr(sys.modules.get("comm"), "create_comm", None))


def test_a_notebook_tqdm_class_from_before_the_launch_is_patched_in_the_rank() -> None:
    from tqdm.notebook import tqdm as notebook_tqdm  # what `from tqdm.auto import tqdm` gives in a kernel

    sink = _launch(bar_class_rank, (notebook_tqdm,), num_processes=1)
    bars = _of(sink, 0, "progress")
    assert bars and bars[-1]["closed"] and bars[-1]["n"] == 5
    assert "container" not in vars(notebook_tqdm)  # the kernel's class is untouched
    assert not getattr(sys.modules["tqdm.std"].tqdm, "_nbaccel_patched", False)


def failing_bar_rank() -> None:
    from tqdm import tqdm

    for i in tqdm(range(10)):
        if i == 3:
            raise RuntimeError("stop")


def test_a_bar_left_by_an_exception_is_marked_failed() -> None:
    sink = CollectingSink()
    with pytest.raises(nbaccel.RankFailedError):
        nbaccel.notebook_launcher(failing_bar_rank, num_processes=1, output=sink, cpu=True)
    last = _of(sink, 0, "progress")[-1]
    assert last["closed"] and last["failed"] and last["n"] == 3


def widget_rank() -> str:
    import ipywidgets
    from IPython.display import display

    slider = ipywidgets.IntSlider(value=3)
    display(slider)
    return type(slider.comm).__name__


def test_a_widget_made_on_a_rank_is_harmless_and_shows_its_text() -> None:
    sink = CollectingSink()
    values = nbaccel.notebook_launcher(widget_rank, num_processes=1, output=sink, cpu=True)
    assert values == ["DummyComm"]  # nothing written to the kernel's sockets from the child
    (shown,) = _of(sink, 0, "display")
    assert "application/vnd.jupyter.widget-view+json" not in shown["data"]
    assert "IntSlider" in shown["data"]["text/plain"]


def test_the_import_hook_runs_after_the_module_and_never_breaks_the_import() -> None:
    import subprocess

    code = (
        "from nbaccel.rank.import_hooks import when_imported\n"
        "when_imported('json', lambda m: print('hooked', m.dumps([1])))\n"
        "when_imported('csv', lambda m: 1 / 0)\n"
        "import json, csv\n"
        "print('imported', csv.__name__)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert run.stdout.splitlines() == ["hooked [1]", "imported csv"]
    assert "could not hook into csv (ZeroDivisionError" in run.stderr


class Table:
    """Stands in for a pandas DataFrame: what display() uses is its _repr_html_."""

    def _repr_html_(self) -> str:
        return "<table><tr><td>1</td></tr></table>"

    def __repr__(self) -> str:
        return "   a\n0  1"


def table_rank(table: Any) -> None:
    from IPython.display import display

    display(table)


def test_a_table_is_displayed_as_html_with_its_text_for_text_views() -> None:
    sink = _launch(table_rank, (Table(),), num_processes=1)
    (shown,) = _of(sink, 0, "display")
    assert shown["data"] == {"text/html": "<table><tr><td>1</td></tr></table>", "text/plain": "   a\n0  1"}


def open_figure_rank() -> None:
    import matplotlib.pyplot as plt

    from nbaccel.rank import display_hooks as rank_hooks

    plt.figure()
    plt.plot([0, 1])
    rank_hooks.finish()  # what the worker is asked to call before it sends the result


@pytest.mark.slow
def test_finish_shows_figures_left_open_as_a_cell_end_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    sink = _launch(open_figure_rank, num_processes=1)
    (figure,) = _of(sink, 0, "display")
    assert figure["data"]["image/png"].startswith("iVBOR")


def update_rank() -> None:
    from IPython.display import display, update_display

    display({"text/plain": "epoch 1"}, raw=True, display_id="loss")
    update_display({"text/plain": "epoch 2"}, raw=True, display_id="loss")


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_update_display_replaces_by_display_id(start_method: str) -> None:
    sink = _launch(update_rank, start_method=start_method, num_processes=1)
    shown = _of(sink, 0, "display")
    assert [(e["data"]["text/plain"], e["display_id"], e["update"]) for e in shown] == [("epoch 1", "loss", False), ("epoch 2", "loss", True)]


@pytest.mark.parametrize("pid", [1, 255, 65_535, 65_536, 4_194_304, 2**31 - 1])
def test_the_prepickled_started_event_is_what_pickling_it_gives(pid: int) -> None:
    from nbaccel.rank import display_hooks as rank_hooks
    from nbaccel.wire import events, rich

    assert events.loads(rank_hooks.started_payload(pid)) == rich.started_event(pid)


def test_tqdms_patched_methods_are_made_in_the_kernel_before_a_fork_and_tqdm_stays_untouched() -> None:
    import os

    import tqdm.std

    from nbaccel.rank import display_hooks as rank_hooks  # noqa: F401 - rank_hooks registers the at-fork hook
    from nbaccel.rank import progress_hooks as rank_progress

    def originals() -> tuple:
        return tuple(vars(tqdm.std.tqdm)[name] for name in ("__init__", "display", "close"))

    before = originals()
    pid = os.fork()  # the at-fork hook (rank_hooks.prepare) makes them in the parent
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    made_for, methods = rank_progress._made["methods"]
    assert made_for == before and rank_progress._patched_methods(tqdm.std.tqdm) is methods
    assert originals() == before and not getattr(tqdm.std.tqdm, "_nbaccel_patched", False)
