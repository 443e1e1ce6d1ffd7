"""Fixtures for tests across nodes: one cluster with two warm agents (2 ranks each) per module."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from nbaccel import Cluster
from tests.agent.harness import start_agents, stop_agents


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """A cluster on loopback with two agents joined, each a "node" of 2 ranks."""
    cluster = Cluster("127.0.0.1:0")
    scratch = tempfile.mkdtemp(prefix="nbaccel-agents-")  # the agents' TMPDIR: what they leave shows here
    agents = start_agents(cluster, nodes=2, nproc=2, env={**os.environ, "TMPDIR": scratch})
    try:
        cluster.wait(nodes=2, timeout=60)
        cluster.agents = agents  # type: ignore[attr-defined]  # for tests that look at them
        cluster.scratch = scratch  # type: ignore[attr-defined]
        yield cluster
    finally:
        cluster.close()
        stop_agents(agents)
        shutil.rmtree(scratch, ignore_errors=True)
