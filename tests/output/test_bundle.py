"""The per-rank bundle (application/vnd.nbaccel.ranks+json) built from real launch views:
valid against its JSON schema, stored by nbformat as JSON, and saying each rank's end in words.

Imports internals (launch.outcome, output.status_words, output.widgets.bundle, output.widgets.live_view, output.widgets.sink, output.widgets.static_view): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
from importlib import resources

import jsonschema
import nbformat
import pytest

from nbaccel.launch.outcome import RankOutcome, RemoteError, Status
from nbaccel.output.status_words import rank_state
from nbaccel.output.widgets.bundle import RANKS_MIME, SCHEMA_VERSION, ranks_bundle
from nbaccel.output.widgets.live_view import LaunchView
from tests.extension_types import strict
from tests.output.conftest import CommLog

SCHEMA = json.loads(resources.files("nbaccel.output.widgets").joinpath("ranks_bundle.schema.json").read_text())
PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="


def _end(view: LaunchView, outcome: RankOutcome) -> None:
    view.set_state(outcome.rank, rank_state(outcome))
    if outcome.is_failure:
        view.panel(outcome.rank).set_failure(outcome)


def _valid(bundle: dict) -> dict:
    jsonschema.validate(bundle, strict(SCHEMA))  # no field the schema (and so bundle.ts, tests/test_extension_types.py) lacks
    return json.loads(json.dumps(bundle))  # plain JSON, as a notebook stores it


def test_all_done_lowest_rank_first(comms: CommLog) -> None:
    view = LaunchView(num_processes=2, log_dir="/tmp/logs/launch-1", log_files=lambda r: f"/tmp/logs/launch-1/rank-{r}.log")
    for rank in (1, 0):
        view.panel(rank).add_lines("stdout", [f"hello from rank {rank}"])
        _end(view, RankOutcome(rank=rank, status=Status.SUCCEEDED, exitcode=0))
    bundle = _valid(ranks_bundle(view, "done in 1.2 s", elapsed={0: 1.2, 1: 1.1}))
    assert (bundle["version"], bundle["title"], bundle["summary"]) == (SCHEMA_VERSION, "2 ranks", "done in 1.2 s")
    assert bundle["log_dir"] == "/tmp/logs/launch-1"
    assert [r["rank"] for r in bundle["ranks"]] == [0, 1]
    zero = bundle["ranks"][0]
    assert zero["status"] == {"kind": "done", "symbol": "✓", "short": "done", "long": "done"}
    assert (zero["elapsed"], zero["elapsed_words"], bundle["ranks"][1]["elapsed_words"]) == (1.2, "1.2 s", "1.1 s")
    assert (zero["elapsed"], zero["node"], zero["failure"], zero["dropped_lines"]) == (1.2, None, None, 0)
    assert zero["outputs"] == [{"output_type": "stream", "name": "stdout", "text": "hello from rank 0\n"}]
    assert zero["log_path"] == "/tmp/logs/launch-1/rank-0.log"


def test_a_failed_rank_carries_its_traceback_and_the_others_say_they_were_stopped(comms: CommLog) -> None:
    view = LaunchView(num_processes=3)
    error = RemoteError("ValueError", "boom", 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: boom\n', 1.0)
    _end(view, RankOutcome(rank=1, status=Status.FAILED, exitcode=1, error=error))
    _end(view, RankOutcome(rank=0, status=Status.STOPPED, signal=15))
    _end(view, RankOutcome(rank=2, status=Status.TIMED_OUT))
    ranks = _valid(ranks_bundle(view, "failed after 2.0 s"))["ranks"]
    failed = ranks[1]
    assert failed["status"]["kind"] == "failed" and failed["status"]["short"] == "failed (ValueError)"
    assert (failed["status"]["exception"], failed["status"]["exit_code"], failed["status"]["signal"]) == ("ValueError", 1, None)
    assert failed["failure"]["output_type"] == "error"
    assert failed["failure"]["traceback"][0] == "rank 1 failed: ValueError: boom"
    assert failed["failure"]["traceback"][-1] == "ValueError: boom"
    assert ranks[0]["status"]["long"] == "stopped by nbaccel after another rank failed (SIGTERM)"
    assert ranks[0]["failure"] is None
    assert ranks[2]["status"]["short"] == "timed out"


@pytest.mark.parametrize(
    ("outcome", "short", "exit_code", "signal"),
    [
        (RankOutcome(rank=0, status=Status.EXITED, exitcode=3), "failed (exit 3)", 3, None),
        (RankOutcome(rank=0, status=Status.SIGNALED, signal=9), "failed (SIGKILL)", None, "SIGKILL"),
    ],
)
def test_exit_codes_and_signals_are_said_in_words(comms: CommLog, outcome: RankOutcome, short: str, exit_code: int | None, signal: str | None) -> None:
    view = LaunchView(num_processes=1)
    _end(view, outcome)
    (entry,) = _valid(ranks_bundle(view, "failed after 1 s"))["ranks"]
    assert (entry["status"]["short"], entry["status"]["exit_code"], entry["status"]["signal"]) == (short, exit_code, signal)
    assert entry["failure"]["output_type"] == "stream" and short.split(" (")[0] in entry["failure"]["text"]


def test_rich_outputs_keep_their_mime_bundles_in_order(comms: CommLog) -> None:
    view = LaunchView(num_processes=2)
    panel = view.panel(1)
    panel.add_lines("stdout", ["before"])
    panel.add_display({"data": {"text/html": "<b>from rank 1</b>", "text/plain": "x"}, "metadata": {}})
    panel.add_display({"data": {"image/png": PNG, "text/plain": "<Figure>"}, "metadata": {"image/png": {"width": 1}}})
    panel.add_lines("stderr", ["after"])
    outputs = _valid(ranks_bundle(view, "done in 1 s"))["ranks"][1]["outputs"]
    assert [o["output_type"] for o in outputs] == ["stream", "display_data", "display_data", "stream"]
    assert outputs[1]["data"]["text/html"] == "<b>from rank 1</b>"
    assert outputs[2]["data"]["image/png"] == PNG and outputs[2]["metadata"] == {"image/png": {"width": 1}}
    assert outputs[3] == {"output_type": "stream", "name": "stderr", "text": "after\n"}


def test_a_capped_log_says_how_much_it_dropped_and_where_the_rest_is(comms: CommLog) -> None:
    view = LaunchView(num_processes=1, max_lines=10, max_displays=1, log_files=lambda r: f"/tmp/l/rank-{r}.log")
    view.panel(0).add_lines("stdout", [f"line {i}" for i in range(1000)])
    for i in range(3):
        view.panel(0).add_display({"data": {"text/plain": f"d{i}"}})
    (entry,) = _valid(ranks_bundle(view, "done in 1 s"))["ranks"]
    shown = sum(o["text"].count("\n") for o in entry["outputs"] if o["output_type"] == "stream")
    assert entry["dropped_lines"] + shown == 1000 and entry["dropped_lines"] >= 900
    assert entry["dropped_displays"] == 2
    assert entry["log_path"] == "/tmp/l/rank-0.log"


def test_the_bundle_is_a_snapshot_later_lines_do_not_change_it(comms: CommLog) -> None:
    view = LaunchView(num_processes=1)
    view.panel(0).add_lines("stdout", ["a"])
    bundle = ranks_bundle(view, "done")
    view.panel(0).add_lines("stdout", ["b"])
    assert bundle["ranks"][0]["outputs"][0]["text"] == "a\n"


def test_nbformat_stores_it_as_json_and_validates_the_notebook(comms: CommLog, tmp_path) -> None:
    view = LaunchView(num_processes=2)
    view.panel(0).add_lines("stdout", ["hi"])
    data = {RANKS_MIME: ranks_bundle(view, "done in 1 s"), "text/plain": "nbaccel: 2 ranks, done in 1 s"}
    cell = nbformat.v4.new_code_cell("%%distributed\nprint('hi')", outputs=[nbformat.v4.new_output("display_data", data=data)])
    path = tmp_path / "saved.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    again = nbformat.read(path, as_version=4)
    nbformat.validate(again)
    stored = again.cells[0].outputs[0].data[RANKS_MIME]
    assert isinstance(stored, dict) and stored["ranks"][0]["outputs"][0]["text"] == "hi\n"
    assert '"application/vnd.nbaccel.ranks+json": {' in path.read_text()  # an object, not a string


def test_the_static_view_carries_the_bundle_beside_its_html_and_text(comms: CommLog) -> None:
    from nbaccel.output.widgets.static_view import static_bundle

    view = LaunchView(num_processes=2)
    view.panel(1).add_lines("stdout", ["from rank 1"])
    data = static_bundle(view, "done in 1 s")
    assert set(data) == {RANKS_MIME, "text/html", "text/plain"}
    assert _valid(data[RANKS_MIME])["ranks"][1]["outputs"][0]["text"] == "from rank 1\n"


def test_the_widget_sink_saves_each_ranks_elapsed_time(comms: CommLog) -> None:
    from nbaccel.output.widgets.sink import LiveViewSink

    published: list[dict] = []

    class Publisher:
        def show(self, data: dict, display_id: str) -> None:
            published.append(data)

        def update(self, data: dict, display_id: str) -> None:
            published.append(data)

    now = [100.0]
    sink = LiveViewSink(publisher=Publisher(), clock=lambda: now[0])
    sink.launch_started(2, 0)
    now[0] += 0.05
    outcomes = [RankOutcome(rank=r, status=Status.SUCCEEDED, exitcode=0) for r in (0, 1)]
    for outcome in outcomes:
        sink.rank_finished(outcome)
    sink.launch_finished(outcomes)
    ranks = _valid(published[-1][RANKS_MIME])["ranks"]
    assert all(0.05 <= r["elapsed"] < 5 for r in ranks), ranks
