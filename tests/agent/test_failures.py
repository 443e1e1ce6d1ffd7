"""What ends a launch across nodes from outside: a node killed, the kernel killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from nbaccel import Cluster, NodeRankFailedError, notebook_launcher
from nbaccel.testing import CollectingSink
from tests.agent.harness import agent_argv, descendants, start_agents, stop_agents, wait_until

pytestmark = pytest.mark.timeout(90)


def _sleep_long() -> None:
    import time

    print("working", flush=True)
    time.sleep(60)


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]


@pytest.mark.orphans  # the test kills a parent (an agent, or the kernel): its ranks end as our orphans
def test_a_killed_node_fails_the_launch_naming_it_and_leaves_no_process() -> None:
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=2, nproc=2)
        try:
            nodes = cluster.wait(nodes=2, timeout=60)
            node_1 = next(a for a in agents if a.pid == nodes[1].pid)  # node ranks follow the join order
            ranks: list[int] = []

            def kill_node_1() -> None:
                wait_until(lambda: len(descendants(node_1.pid)) >= 2, 10)
                ranks.extend(descendants(agents[0].pid) + descendants(agents[1].pid))
                node_1.kill()

            threading.Thread(target=kill_node_1, daemon=True).start()
            with pytest.raises(NodeRankFailedError) as caught:
                notebook_launcher(_sleep_long, cluster=cluster, output=CollectingSink())
            killed_at = time.monotonic()
            error = caught.value
            assert error.exc_type == "NodeLostError" and error.rank in (2, 3)
            assert "node 1 (" in str(error) and "was lost: its connection closed" in str(error) and "its ranks 2, 3 ended with it" in str(error)
            assert [o.status.value for o in error.outcomes] == ["stopped", "stopped", "failed", "failed"]
            assert wait_until(lambda: not _alive(ranks), 5.0), f"ranks left running: {_alive(ranks)}"
            assert time.monotonic() - killed_at < 5.0
            assert notebook_launcher(lambda: "survivor", cluster=cluster, output=CollectingSink()) == ["survivor"] * 2
        finally:
            cluster.close()
            stop_agents(agents)


@pytest.mark.orphans  # the test kills a parent (an agent, or the kernel): its ranks end as our orphans
def test_agents_stop_their_ranks_and_exit_when_the_kernel_is_killed() -> None:
    script = os.path.join(os.path.dirname(__file__), "kernel_script.py")
    kernel = subprocess.Popen([sys.executable, script, "2"], stdout=subprocess.PIPE, text=True)
    agents: list[subprocess.Popen[str]] = []
    try:
        assert kernel.stdout is not None
        info = json.loads(kernel.stdout.readline())
        agents = [subprocess.Popen(agent_argv(info["address"], info["token_file"], 1), stderr=subprocess.PIPE, text=True) for _ in range(2)]
        assert kernel.stdout.readline().strip() == "launched"
        assert wait_until(lambda: all(descendants(a.pid) for a in agents), 20)
        ranks = [p for a in agents for p in descendants(a.pid)]
        kernel.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        for agent in agents:
            agent.wait(10)
        assert time.monotonic() - killed_at < 10.0
        assert wait_until(lambda: not _alive(ranks), 3.0)
        assert all("connection to the kernel" in (a.stderr.read() if a.stderr else "") for a in agents)
    finally:
        kernel.kill()
        kernel.wait(5)
        for agent in agents:
            agent.kill()
            agent.wait(5)
            if agent.stderr:
                agent.stderr.close()
        if kernel.stdout:
            kernel.stdout.close()
        try:
            os.unlink(info["token_file"])
        except (NameError, OSError):
            pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_an_agent_told_to_end_stops_its_ranks_first_and_exits_cleanly(sig: signal.Signals) -> None:
    """scancel sends SIGTERM, a closed ssh session SIGHUP: the agent stops its ranks (nothing is
    left behind, not even as an orphan), says so to the kernel (its node is lost), and exits 0."""
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=1, nproc=2)
        try:
            cluster.wait(nodes=1, timeout=60)
            ranks: list[int] = []

            def end_the_agent() -> None:
                wait_until(lambda: len(descendants(agents[0].pid)) >= 2, 10)
                ranks.extend(descendants(agents[0].pid))
                agents[0].send_signal(sig)

            threading.Thread(target=end_the_agent, daemon=True).start()
            with pytest.raises(NodeRankFailedError, match="node 0 .* was lost"):
                notebook_launcher(_sleep_long, cluster=cluster, output=CollectingSink())
            assert agents[0].wait(10) == 0
            assert len(ranks) == 2 and wait_until(lambda: not _alive(ranks), 5.0), f"ranks left running: {_alive(ranks)}"
        finally:
            cluster.close()
            stop_agents(agents)
