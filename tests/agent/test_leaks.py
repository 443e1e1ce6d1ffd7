"""Fifty launches across two nodes leave no process, thread, fd, listening port or temp file behind."""

from __future__ import annotations

import os
import re
import threading

import psutil
import pytest

from nbaccel import Cluster, NodeRankFailedError, notebook_launcher
from nbaccel.testing import CollectingSink
from tests.agent.harness import descendants, open_fds, start_agents, stop_agents, wait_until

pytestmark = pytest.mark.timeout(120)


def _listening() -> set[int]:
    return {c.laddr.port for c in psutil.Process().net_connections(kind="inet") if c.status == psutil.CONN_LISTEN}


def _fail_on_rank_1() -> None:
    import os

    if os.environ["RANK"] == "1":
        raise ValueError("expected")


def test_fifty_launches_leave_nothing_behind(two_nodes: Cluster) -> None:
    agents = [a.pid for a in two_nodes.agents]  # type: ignore[attr-defined]
    notebook_launcher(lambda: 0, cluster=two_nodes, output=CollectingSink())  # warm: lazily imported modules
    before = (open_fds(), threading.active_count(), [open_fds(a) for a in agents], _listening())
    for i in range(50):
        if i % 10 == 9:
            with pytest.raises(NodeRankFailedError):
                notebook_launcher(_fail_on_rank_1, cluster=two_nodes, output=CollectingSink())
        else:
            assert notebook_launcher(lambda: os.getpid(), cluster=two_nodes, output=CollectingSink()) != []
    assert not any(descendants(a) for a in agents)
    # An agent frees a launch's pipes right after reporting it finished: give it a moment.
    assert wait_until(lambda: [open_fds(a) for a in agents] == before[2], 2.0), ([open_fds(a) for a in agents], before[2])
    after = (open_fds(), threading.active_count(), [open_fds(a) for a in agents], _listening())
    assert after == before
    # No temp file or log folder on the nodes; each agent keeps one private stack folder for its
    # life (nbaccel.launch.stacks), reused launch after launch: one group folder of plain rank files.
    left = os.listdir(two_nodes.scratch)  # type: ignore[attr-defined]
    assert all(name.startswith("nbaccel-stacks-") for name in left) and len(left) <= len(agents), left
    for name in left:
        groups = os.listdir(os.path.join(two_nodes.scratch, name))  # type: ignore[attr-defined]
        assert groups in ([], ["group1"]), groups
        for group in groups:
            files = os.listdir(os.path.join(two_nodes.scratch, name, group))  # type: ignore[attr-defined]
            assert all(re.fullmatch(r"rank\d+\.txt(\.last)?", f) for f in files), files


def test_an_agent_that_leaves_its_cluster_removes_its_stack_folder(tmp_path) -> None:
    scratch = tmp_path / "agent-tmp"
    scratch.mkdir()
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=1, nproc=2, env={**os.environ, "TMPDIR": str(scratch)})
        try:
            cluster.wait(nodes=1, timeout=60)
            assert notebook_launcher(lambda: 0, cluster=cluster, output=CollectingSink()) == [0, 0]
            assert [p.name for p in scratch.iterdir()][0].startswith("nbaccel-stacks-")
        except BaseException:
            stop_agents(agents)
            raise
    stop_agents(agents)  # they leave when their cluster closes
    assert [a.returncode for a in agents] == [0]
    assert list(scratch.iterdir()) == []
