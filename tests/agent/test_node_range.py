"""A node count that may grow: ``cluster.wait(nodes="MIN:MAX", settle=S)`` with real loopback agents,
launches and pools on the nodes joined, and ``pool.restart()`` taking new nodes and dropping lost ones.
The range lives in the cluster, so it is the same whichever way the agents were started. It imports the internal ``node_range`` to check
the refusal words without a cluster."""

from __future__ import annotations

import os
import time

import pytest

import nbaccel
from nbaccel import Cluster
from nbaccel.cluster.cluster import node_range
from nbaccel.testing import CollectingSink, scaled
from tests.agent.harness import start_agents, stop_agents, wait_until

pytestmark = pytest.mark.timeout(120)


def _rank() -> int:
    import os

    return int(os.environ["RANK"])


@pytest.mark.parametrize("wrong", ["4:2", "0:2", "two", "2:", True, 0])
def test_a_range_that_is_not_one_is_refused(wrong: object) -> None:
    with pytest.raises(ValueError, match=r"give a node count \(2\) or a range MIN:MAX"):
        node_range(wrong)  # type: ignore[arg-type]


def test_wait_returns_at_the_minimum_after_the_settle_time_and_the_launch_uses_the_nodes_joined() -> None:
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=2, nproc=1)
        try:
            cluster.wait(nodes=2, timeout=60)  # both in: what follows times the settle alone
            started = time.monotonic()
            nodes = cluster.wait(nodes="2:4", timeout=60, settle=1.5)
            took = time.monotonic() - started
            assert len(nodes) == 2 and 1.5 <= took < 1.5 + scaled(1.0)  # waited the settle time for a third, then went on
            assert nbaccel.notebook_launcher(_rank, cluster=cluster, output=CollectingSink()) == [0, 1]
        finally:
            cluster.close()
            stop_agents(agents)


def test_wait_returns_as_soon_as_the_maximum_joined() -> None:
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=3, nproc=1)
        try:
            started = time.monotonic()
            nodes = cluster.wait(nodes="2:3", timeout=60, settle=60)
            assert len(nodes) == 3 and time.monotonic() - started < 50  # not the 60 s settle
            assert nbaccel.notebook_launcher(_rank, cluster=cluster, output=CollectingSink()) == [0, 1, 2]
        finally:
            cluster.close()
            stop_agents(agents)


def test_wait_fails_naming_the_minimum_when_too_few_joined() -> None:
    with Cluster("127.0.0.1:0") as cluster, pytest.raises(TimeoutError, match=r"0 of 2 nodes joined"):
        cluster.wait(nodes="2:4", timeout=0.3, settle=5)


@pytest.mark.orphans  # an agent is killed on purpose: its ranks end as our orphans
def test_pool_restart_takes_nodes_joined_since_and_drops_lost_ones_saying_which(capsys: pytest.CaptureFixture[str]) -> None:
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=2, nproc=1)
        try:
            cluster.wait(nodes="2:3", timeout=60, settle=0.5)
            pool = nbaccel.start_workers(cluster=cluster)
            try:
                assert pool.run(lambda: int(os.environ["RANK"]), output=CollectingSink()) == [0, 1]
                agents += start_agents(cluster, nodes=1, nproc=1)  # a third node comes
                gone = next(n for n in cluster.nodes if n.pid == agents[0].pid)
                kept = next(n for n in cluster.nodes if n.pid == agents[1].pid)
                agents[0].kill()  # a node goes
                agents[0].wait(5)
                assert wait_until(lambda: len(cluster.live_nodes) == 1, scaled(5))
                capsys.readouterr()
                pool.restart(wait_for="2:3", timeout=60, settle=1.0)  # 2 once the third joined; no fourth comes
                said = capsys.readouterr().out
                assert "nbaccel: restarting the workers on 2 node(s): node(s) 2 (" in said, said
                assert f"joined since; node(s) {gone.name} (" in said and "lost, dropped" in said
                assert pool.run(lambda: int(os.environ["RANK"]), output=CollectingSink()) == [0, 1]
                assert sorted(n.name for n in cluster.live_nodes) == sorted([kept.name, "2"])
            finally:
                pool.stop()
        finally:
            cluster.close()
            stop_agents(agents)
