"""Fixtures for tests across nodes: one cluster with two warm agents (2 ranks each) per module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nbaccel.agent.cluster import Cluster
from tests.agent.harness import start_agents, stop_agents


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """A cluster on loopback with two agents joined, each a "node" of 2 ranks."""
    cluster = Cluster("127.0.0.1:0")
    agents = start_agents(cluster, nodes=2, nproc=2)
    try:
        cluster.wait(nodes=2, timeout=60)
        cluster.agents = agents  # type: ignore[attr-defined]  # for tests that look at them
        yield cluster
    finally:
        cluster.close()
        stop_agents(agents)
