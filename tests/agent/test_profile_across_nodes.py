"""``profile=`` on two agents on loopback: every rank's trace comes through its agent, lanes named by node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nbaccel import notebook_launcher
from nbaccel.agent.cluster import Cluster
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


def test_a_profiled_launch_across_two_agents_merges_every_ranks_trace_and_names_the_straggler(two_nodes: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert notebook_launcher(_uneven_work, cluster=two_nodes, output=CollectingSink(), profile=str(tmp_path)) == [0, 1, 2, 3]
    trace = json.loads((tmp_path / "trace.json").read_text())
    lanes = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert sorted(lanes) == [0, 1, 2, 3]
    assert lanes[0].startswith("rank 0 · node 0") and lanes[3].startswith("rank 3 · node 1"), lanes
    for rank in range(4):
        assert any(e["pid"] == rank and e.get("name") == "gloo:all_reduce" for e in trace["traceEvents"]), rank
    assert "rank 1 spent" in capsys.readouterr().out
