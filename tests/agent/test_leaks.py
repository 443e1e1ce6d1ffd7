"""Fifty launches across two nodes leave no process, thread, fd, listening port or temp file behind."""

from __future__ import annotations

import os
import threading

import psutil
import pytest

from nbaccel import Cluster, NodeRankFailedError, notebook_launcher
from nbaccel.testing import CollectingSink
from tests.agent.harness import descendants, open_fds, wait_until

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
    assert os.listdir(two_nodes.scratch) == []  # type: ignore[attr-defined]  # no temp file or log folder on the nodes
