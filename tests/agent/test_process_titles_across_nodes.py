"""Node agents and their ranks say what they are in ps, top and nvidia-smi (/proc/<pid>/comm and cmdline).

Imports internals (rank.process_title): its ``command_line`` reads /proc as ps does.
"""

from __future__ import annotations

import os

import pytest

from nbaccel import Cluster, notebook_launcher
from nbaccel.rank.process_title import command_line
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(60)


def comm(pid: int) -> str:
    with open(f"/proc/{pid}/comm") as file:
        return file.read().strip()


def step() -> tuple[str, str]:
    return comm(os.getpid()), command_line(os.getpid())


def test_each_agent_is_named_by_its_node_and_its_cluster(two_nodes: Cluster) -> None:
    for node in two_nodes.nodes:
        assert comm(node.pid) == f"nbaccel-agent{node.name}"
        assert command_line(node.pid) == f"nbaccel agent node {node.name} (cluster {two_nodes.address})"


def test_a_rank_on_a_node_is_named_by_its_global_rank_and_its_function(two_nodes: Cluster) -> None:
    titles = notebook_launcher(step, cluster=two_nodes, output=CollectingSink())
    assert titles == [(f"nbaccel-r{rank}/4", f"nbaccel rank {rank}/4 (step)") for rank in range(4)]
