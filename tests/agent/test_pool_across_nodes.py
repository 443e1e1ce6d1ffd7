"""Persistent workers across two loopback agents: one process group, namespaces that stay."""

from __future__ import annotations

import time

import pytest

from nbaccel import Cluster, NodeRankFailedError, PoolStoppedError, notebook_launcher, start_workers
from nbaccel.testing import CollectingSink, scaled
from tests.agent.harness import descendants, wait_until
from tests.handshake import InterruptOnceAllSay

pytestmark = pytest.mark.timeout(90)


def _all_reduce() -> float:
    import torch
    import torch.distributed as dist

    total = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(total)
    return total.item()


def test_a_pool_across_nodes_keeps_its_group_and_namespaces(two_nodes: Cluster) -> None:
    agents = [a.pid for a in two_nodes.agents]  # type: ignore[attr-defined]
    pool = start_workers(cluster=two_nodes)
    try:
        workers = [p for a in agents for p in descendants(a)]
        assert len(workers) == 4 and pool.devices == ["cpu"] * 4
        assert pool.run(_all_reduce) == [6.0] * 4
        assert pool.run(_all_reduce) == [6.0] * 4  # the same group, cell after cell
        pool.push(scale=10)
        assert pool.run(lambda: __import__("os").environ["RANK"]) == ["0", "1", "2", "3"]
        assert pool.pull("scale", rank=3) == 10
        assert pool.run(lambda: 7, ranks=[1, 2]) == {1: 7, 2: 7}
        sink = CollectingSink()
        pool.run(lambda: print("from a worker"), output=sink)
        assert all(sink.text(r) == ["from a worker"] for r in range(4))
        with pytest.raises(NodeRankFailedError, match="rank 2 on node 1"):
            pool.run(lambda: 1 / (int(__import__("os").environ["RANK"]) - 2))
        assert pool.run(lambda: "still here") == ["still here"] * 4  # a failing task keeps the workers
        assert [(s.rank, s.state) for s in pool.status()] == [(r, "idle") for r in range(4)]
        assert [p for a in agents for p in descendants(a)] == workers
    finally:
        pool.stop()
    assert wait_until(lambda: not any(descendants(a) for a in agents), 3.0)
    with pytest.raises(PoolStoppedError):
        pool.run(lambda: 1)
    assert notebook_launcher(lambda: 1, cluster=two_nodes, output=CollectingSink()) == [1] * 4  # the cluster is free again


def _nap() -> None:
    import time

    print("napping", flush=True)
    time.sleep(30)


def test_an_interrupted_task_leaves_the_pool_alive(two_nodes: Cluster) -> None:
    with start_workers(cluster=two_nodes) as pool:
        sink = InterruptOnceAllSay("napping", ranks=4)
        with pytest.raises(KeyboardInterrupt):
            pool.run(_nap, output=sink)
        assert sink.sent_at is not None and time.monotonic() - sink.sent_at < scaled(5.0)
        assert pool.run(lambda: "after", output=CollectingSink()) == ["after"] * 4


def _hold_memory(namespace: dict) -> None:
    namespace["held"] = bytearray(64 * 2**20)  # written: resident, on every worker


def test_status_between_cells_shows_what_each_agent_last_sampled_of_its_ranks(two_nodes: Cluster) -> None:
    pool = start_workers(cluster=two_nodes)
    try:
        pool.run_task(_hold_memory, output="text")
        deadline = time.monotonic() + scaled(10)
        while True:  # the agents sample once a second, between cells too
            statuses = pool.status()
            if all(s.peak_memory_mb is not None and s.peak_memory_mb >= 64 for s in statuses) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert [s.rank for s in statuses] == [0, 1, 2, 3]
        assert all(s.peak_memory_mb is not None and s.peak_memory_mb >= 64 for s in statuses), statuses
        assert all(s.cpu_percent is not None and s.cpu_percent >= 0 for s in statuses), statuses
    finally:
        pool.stop()
