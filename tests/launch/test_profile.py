"""``profile=``: real ranks on gloo under torch.profiler; the traces, the merged trace and the summary.

Imports internals (output.profile_sink, output.sinks, rank.profiling, wire): it tests those units directly, below the public face.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import nbaccel
from nbaccel.testing import CollectingSink, scaled
from tests.handshake import mark, wait_for

pytestmark = pytest.mark.timeout(120)


def uneven_work(steps: int = 4) -> int:
    """Rank 1 does four times rank 0's matrix work between all_reduces (twice was within what two
    busy shared cores make of equal work: compute is measured as the time operators take)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    a = torch.randn(400, 400)
    t = torch.zeros(4)
    for _ in range(steps):
        for _ in range(25 if rank == 0 else 100):
            a = torch.mm(a, a).clamp_(-1, 1)
        dist.all_reduce(t)
    return rank


class Shown:
    """The summaries a ProfileSink showed."""

    def __init__(self) -> None:
        self.bundles: list[dict[str, Any]] = []

    def __call__(self, bundle: dict[str, Any]) -> None:
        self.bundles.append(bundle)


def profiled_sink(folder: Path, shown: Shown, base: Any = None) -> Any:
    from nbaccel.output.profile_sink import ProfileSink
    from nbaccel.output.sinks import TeeSink

    return TeeSink(base or CollectingSink(), ProfileSink(folder, show=shown))


def lanes(trace: dict[str, Any]) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}


def collectives(trace: dict[str, Any], rank: int) -> list[tuple[float, float]]:
    return [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e["pid"] == rank and e.get("name") == "gloo:all_reduce"]


@pytest.mark.slow
def test_the_summary_names_the_rank_doing_twice_the_work_and_the_merged_trace_has_both_lanes_on_one_clock(tmp_path: Path) -> None:
    shown = Shown()
    from nbaccel.wire.rank_calls import Profiled

    assert nbaccel.notebook_launcher(Profiled(uneven_work), num_processes=2, output=profiled_sink(tmp_path, shown)) == [0, 1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0.json", "rank1.json", "trace.json"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert lanes(trace) == {0: "rank 0", 1: "rank 1"}
    ends = [collectives(trace, rank) for rank in (0, 1)]
    assert len(ends[0]) == len(ends[1]) == 4, ends
    for (_, end0), (_, end1) in zip(*ends, strict=True):  # an all_reduce ends together on both ranks: one clock
        assert abs(end0 - end1) < scaled(0.05) * 1e6
    text = shown.bundles[-1]["text/plain"]
    assert "rank 1 spent" in text and "more in compute; rank 0 waited" in text and "in all_reduce" in text, text
    assert "<table class='nbaccel-profile'>" in shown.bundles[-1]["text/html"]
    assert "<svg" in shown.bundles[-1]["text/html"] and "<rect" in shown.bundles[-1]["text/html"]  # the timeline picture


def test_profile_true_writes_into_the_launch_log_folder_and_says_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NBACCEL_LOG_DIR", str(tmp_path))
    assert nbaccel.notebook_launcher(uneven_work, args=(1,), num_processes=2, output="text", profile=True) == [0, 1]
    merged = list(tmp_path.glob("*/trace.json"))
    assert len(merged) == 1, list(tmp_path.rglob("*"))
    assert f"merged trace in {merged[0]}" in capsys.readouterr().out


def stopped_after_a_peer_fails(stepped: str) -> None:
    import time

    import torch

    if os.environ["RANK"] == "1":
        wait_for(stepped)  # rank 0 has an op in its trace
        raise RuntimeError("rank 1 gives up")
    while True:  # rank 0 computes until the kernel stops it (SIGTERM); a few ops a step keep the trace small
        torch.ones(50, 50).sum()
        if not os.path.exists(stepped):
            mark(stepped)
        time.sleep(0.01)


def test_a_rank_stopped_after_a_peers_failure_still_writes_its_trace(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    stepped = str(tmp_path_factory.mktemp("markers") / "stepped")  # not in the trace folder, whose files are checked
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 gives up"):
        nbaccel.notebook_launcher(stopped_after_a_peer_fails, (stepped,), num_processes=2, output="text", profile=str(tmp_path))
    assert {p.name for p in tmp_path.iterdir()} == {"rank0.json", "rank1.json", "trace.json"}
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("name") == "aten::sum" and e["pid"] == 0 for e in trace["traceEvents"])


class InterruptWhenWorking(CollectingSink):
    """Interrupts the kernel (this process) once every rank said it is working: no timer, no sleep."""

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        super().output(rank, stream, lines)
        if all(any("working" in line for line in self.text(r)) for r in (0, 1)):
            os.kill(os.getpid(), signal.SIGINT)


def work_until_interrupted() -> None:
    import time

    import torch

    print("working", flush=True)
    while True:
        torch.ones(50, 50).sum()
        time.sleep(0.01)


def test_an_interrupted_profiled_launch_still_writes_every_trace(tmp_path: Path) -> None:
    shown = Shown()
    from nbaccel.wire.rank_calls import Profiled

    with pytest.raises(KeyboardInterrupt):
        nbaccel.notebook_launcher(Profiled(work_until_interrupted), num_processes=2, output=profiled_sink(tmp_path, shown, InterruptWhenWorking()))
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert lanes(trace) == {0: "rank 0", 1: "rank 1"}
    assert any(e.get("name") == "aten::sum" and e["pid"] == 1 for e in trace["traceEvents"])


def what_was_imported() -> list[str]:
    return sorted(name for name in sys.modules if name.startswith("nbaccel.") and "profil" in name)


def test_without_profile_nothing_of_it_is_imported_in_the_kernel_or_the_ranks() -> None:
    for name in [n for n in sys.modules if n.startswith("nbaccel.") and "profil" in n]:
        del sys.modules[name]  # an earlier test imported them; a plain launch must not again
    values = nbaccel.notebook_launcher(what_was_imported, num_processes=2, output=CollectingSink())
    assert values == [[], []]
    assert what_was_imported() == []


@pytest.mark.parametrize("bad", [3, "", "  ", ["dir"]])
def test_a_bad_profile_value_is_refused_before_anything_starts(bad: object) -> None:
    with pytest.raises(ValueError, match=r"profile must be True, False or a folder for the traces, got "):
        nbaccel.notebook_launcher(int, num_processes=2, profile=bad)  # type: ignore[arg-type]


def test_a_profile_that_cannot_be_written_is_said_and_never_hides_the_launch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from nbaccel.output.profile_sink import ProfileSink
    from nbaccel.wire import rich

    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    sink = ProfileSink(blocked / "traces", show=Shown())
    sink.launch_started(1, attempt=0)
    sink.event(0, rich.profile_event(0, "host", 0, 1, '{"traceEvents": []}'))
    sink.launch_finished([])  # no exception
    assert "nbaccel: could not write the profile (" in capsys.readouterr().out
