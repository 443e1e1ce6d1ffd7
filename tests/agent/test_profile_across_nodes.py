"""``profile=`` on two agents on loopback: every rank's trace comes through its agent, lanes named by
node, on the kernel's clock even when a node's clock is off (a test seam skews it).

Imports internals (net.clock for the seam's variable, output.profile_sink for a profiled call on
workers, which the public face reaches only through the magic).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbaccel import Cluster, notebook_launcher
from nbaccel.testing import CollectingSink, scaled, skewed_clock_environment
from tests.agent.harness import start_agents, stop_agents
from tests.handshake import MarkWhen, wait_for

pytestmark = pytest.mark.timeout(120)


def _uneven_work() -> int:
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    a = torch.randn(400, 400)
    t = torch.zeros(4)
    # Compute for a set time, not a set count: on a fast CPU a count's gap fell under the
    # straggler threshold (a CI run: 0.30 s against 0.28 s), on a busy one under its noise.
    share = 0.3 if rank == 1 else 0.1
    for _ in range(4):
        until = time.monotonic() + share
        while time.monotonic() < until:
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


def _hold_until_sampled(sampled: str) -> int:
    """Hold 64 MiB until the kernel's sink saw every rank's sample showing it (asleep meanwhile:
    four spinning ranks on two cores would starve the agents' heartbeats)."""
    held = bytearray(b"x" * (64 * 2**20))
    wait_for(sampled, timeout=scaled(60))
    return len(held) + int(os.environ["RANK"])


def _every_rank_sampled_holding(sink: CollectingSink) -> bool:
    return all(any(e["type"] == "resources" and e["rss"] >= 64 * 2**20 for e in sink.events.get(rank, [])) for rank in range(4))


def test_each_agent_samples_its_own_ranks_and_sends_the_samples_over_its_link(two_nodes: Cluster, tmp_path: Path) -> None:
    sampled = str(tmp_path / "sampled")
    sink = MarkWhen(sampled, _every_rank_sampled_holding)
    notebook_launcher(_hold_until_sampled, (sampled,), cluster=two_nodes, output=sink)
    for rank in range(4):
        samples = [e for e in sink.events.get(rank, []) if e["type"] == "resources"]
        assert samples, (rank, sink.events.get(rank))
        assert samples[-1]["rss"] >= 64 * 2**20 and samples[-1]["peak_rss"] >= samples[-1]["rss"]


SKEW_NS = 5 * 10**9  # node 1's clock, as the kernel sees it: 5 s ahead


@pytest.fixture(scope="module")
def skewed_nodes() -> Iterator[Cluster]:
    """Two loopback agents of 2 ranks, node 1's clock 5 s ahead (``NBACCEL_TEST_CLOCK_SKEW_NS``).

    The seam: the skewed agent answers the kernel's clock probes 5 s ahead, and its ranks stamp
    their profiled span and their trace's ``baseTimeNanoseconds`` 5 s ahead (torch's profiler
    reads CLOCK_REALTIME in C++ and cannot be shifted from outside, so ``nbaccel.rank.profiling``
    moves the base where it reads the trace). From the kernel's side it is a machine whose clock
    is 5 s off: only the measured offset can bring its lanes back.
    """
    cluster = Cluster("127.0.0.1:0")
    agents = start_agents(cluster, nodes=1, nproc=2)
    try:
        cluster.wait(nodes=1, timeout=60)  # joined first: node 0 (every agent is on the kernel's address)
        agents += start_agents(cluster, nodes=1, nproc=2, env=skewed_clock_environment(SKEW_NS))
        cluster.wait(nodes=2, timeout=60)
        yield cluster
    finally:
        cluster.close()
        stop_agents(agents)


def _all_reduces(trace: dict[str, Any], rank: int | None = None) -> list[tuple[float, float]]:
    """Each of ``rank``'s (every rank's: None) all_reduce spans in Unix-epoch seconds, in order."""
    base = int(trace.get("baseTimeNanoseconds", 0))
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in trace["traceEvents"] if e.get("name") == "gloo:all_reduce" and rank in (None, e["pid"])]
    return [((start * 1000 + base) / 1e9, (end * 1000 + base) / 1e9) for start, end in sorted(spans)]


def _assert_on_one_clock(merged: dict[str, Any], cluster: Cluster, calls: int) -> None:
    """Every rank's k-th all_reduce, in the merged trace, as one call on one clock."""
    spans = {rank: _all_reduces(merged, rank) for rank in range(4)}
    assert all(len(s) == calls for s in spans.values()), spans
    uncertainty = sum(n.clock.round_trip_ns or 0 for n in cluster.nodes) / 2e9
    for k in range(calls):
        ends = [spans[rank][k][1] for rank in spans]
        last_entry = max(spans[rank][k][0] for rank in spans)
        # On one clock no rank leaves the k-th all_reduce before the last one entered it (node 1 left
        # 5 s ahead would break this by 5 s), and all leave it together, give or take scheduling.
        assert min(ends) > last_entry - uncertainty - 0.001, (k, spans)
        assert max(ends) - min(ends) < scaled(0.05), (k, spans)


def _ms(words: str) -> float:
    """The offset in ``"clock +5000.012 ms ± 0.100 ms"`` (or ``"+5000.012 ms"``), in ms."""
    return float(re.findall(r"[-+]\d+\.\d+", words)[0])


def test_a_node_whose_clock_is_5_s_ahead_is_measured_and_its_lanes_are_put_back_on_the_kernels_clock(
    skewed_nodes: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node 1's clock is really 5 s ahead as the kernel sees it (the seam: ``skewed_nodes``); the
    measured offset, and only it, puts its ranks' all_reduces back beside node 0's."""
    node0, node1 = skewed_nodes.nodes
    assert node0.clock.offset_ns is not None and node1.clock.offset_ns is not None, (node0.clock, node1.clock)  # wait() waited for them
    assert abs(node0.clock.offset_ns) < scaled(0.005) * 1e9, node0.clock
    assert abs(node1.clock.offset_ns - SKEW_NS) < scaled(0.005) * 1e9, node1.clock
    shown = f"clock {node1.clock.describe()}"  # "+5000.012 ms ± 0.100 ms": `%distributed cluster` shows it
    assert shown in repr(skewed_nodes) and node1.clock.describe() in skewed_nodes._repr_html_(), repr(skewed_nodes)

    assert notebook_launcher(_uneven_work, cluster=skewed_nodes, output=CollectingSink(), profile=str(tmp_path)) == [0, 1, 2, 3]
    raw = {rank: _all_reduces(json.loads((tmp_path / f"rank{rank}.json").read_text())) for rank in range(4)}
    # As the ranks wrote them, node 1's all_reduces end 5 s after node 0's same calls: the skew is real.
    assert all(abs(raw[2][k][1] - raw[0][k][1] - SKEW_NS / 1e9) < 1.0 for k in range(4)), raw

    merged = json.loads((tmp_path / "trace.json").read_text())
    _assert_on_one_clock(merged, skewed_nodes, calls=4)
    labels = {e["pid"]: e["args"]["labels"] for e in merged["traceEvents"] if e.get("name") == "process_labels"}
    assert labels[3] == labels[2] and labels[1] == labels[0], labels
    assert abs(_ms(labels[2]) - SKEW_NS / 1e6) < scaled(5.0) and abs(_ms(labels[0])) < scaled(5.0), labels

    out = capsys.readouterr().out
    said = re.search(r"each node's clock minus the kernel's: node 0 (\S+ ms) ± \S+ ms, node 1 (\S+ ms) ± \S+ ms", out)
    assert said and abs(_ms(said[2]) - SKEW_NS / 1e6) < scaled(5.0), out
    assert "rank 1 spent" in out, out
    for row in [line.split() for line in out.splitlines() if line[:1].isdigit()]:
        wall, waiting = float(row[1]), float(row[7])
        assert waiting <= wall, row  # with node 1 left 5 s ahead, ranks 0 and 1 would "wait" 20 s of a 1 s call


def _all_reduces_on_workers(calls: int) -> int:
    import torch
    import torch.distributed as dist

    t = torch.zeros(4)
    for _ in range(calls):
        torch.mm(torch.randn(200, 200), torch.randn(200, 200))
        dist.all_reduce(t)
    return dist.get_rank()


def test_a_profiled_call_on_workers_across_a_skewed_node_is_on_the_kernels_clock_too(skewed_nodes: Cluster, tmp_path: Path) -> None:
    from nbaccel import start_workers
    from nbaccel.output.profile_sink import profiled

    pool = start_workers(cluster=skewed_nodes)
    try:
        task, sink = profiled(_all_reduces_on_workers, CollectingSink(), str(tmp_path))
        assert pool.run(task, 3, output=sink) == [0, 1, 2, 3]
    finally:
        pool.stop()
    _assert_on_one_clock(json.loads((tmp_path / "trace.json").read_text()), skewed_nodes, calls=3)
