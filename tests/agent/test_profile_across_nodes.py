"""``profile=`` on two agents on loopback: every rank's trace comes through its agent, lanes named by node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbaccel import Cluster, notebook_launcher
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(120)


def _uneven_work() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    a = torch.randn(400, 400)
    t = torch.zeros(4)
    for _ in range(4):
        for _ in range(50 if rank == 1 else 25):
            a = torch.mm(a, a).clamp_(-1, 1)
        dist.all_reduce(t)
    return rank


def test_a_profiled_launch_across_two_agents_merges_every_ranks_trace_and_names_the_straggler(
    two_nodes: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert notebook_launcher(_uneven_work, cluster=two_nodes, output=CollectingSink(), profile=str(tmp_path)) == [0, 1, 2, 3]
    trace = json.loads((tmp_path / "trace.json").read_text())
    lanes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(lanes) == [0, 1, 2, 3]
    assert lanes[0].startswith("rank 0 · node 0") and lanes[3].startswith("rank 3 · node 1"), lanes
    for rank in range(4):
        assert any(e["pid"] == rank and e.get("name") == "gloo:all_reduce" for e in trace["traceEvents"]), rank
    assert "rank 1 spent" in capsys.readouterr().out


def _spin(seconds: float = 2.5) -> int:
    import os
    import time

    held = bytearray(b"x" * (64 * 2**20))
    time.sleep(seconds)  # four spinning ranks on two cores would starve the agents' heartbeats
    return len(held) + int(os.environ["RANK"])


def test_each_agent_samples_its_own_ranks_and_sends_the_samples_over_its_link(two_nodes: Cluster) -> None:
    sink = CollectingSink()
    notebook_launcher(_spin, cluster=two_nodes, output=sink)
    for rank in range(4):
        samples = [e for e in sink.events.get(rank, []) if e["type"] == "resources"]
        assert samples, (rank, sink.events.get(rank))
        assert samples[-1]["rss"] >= 64 * 2**20 and samples[-1]["peak_rss"] >= samples[-1]["rss"]
