"""The kernel's Cluster and the agent's command line: addresses, token, joining, refusals.

Imports internals (agent, agent.node, net.signing): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from nbaccel import Cluster
from nbaccel.agent.node import EXIT_REFUSED, EXIT_UNREACHABLE
from nbaccel.net.clock import JOIN_SAMPLES
from nbaccel.net.signing import new_secret, write_token_file
from nbaccel.testing import scaled
from tests.agent.harness import agent_argv, start_agents, stop_agents

pytestmark = pytest.mark.timeout(60)


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]


def test_cluster_listens_on_its_address_only_and_says_how_to_join() -> None:
    threads = threading.active_count()
    with Cluster("127.0.0.1:0") as cluster:
        assert cluster.port > 0 and cluster.address == f"127.0.0.1:{cluster.port}"
        assert ("127.0.0.1", cluster.port) in _listening(os.getpid())
        assert stat.S_IMODE(os.stat(cluster.token_file).st_mode) == 0o600
        command = cluster.agent_command(nproc_per_node=4)
        assert command == f"nbaccel-agent {cluster.address} --token-file {cluster.token_file} --nproc-per-node 4"
        secret_hex = Path(cluster.token_file).read_text().strip()
        assert secret_hex not in command and secret_hex not in repr(cluster) and secret_hex not in cluster._repr_html_()
        assert cluster.agent_command() in repr(cluster) and "nbaccel-agent" in cluster._repr_html_()
        token_file, port = cluster.token_file, cluster.port
    assert not os.path.exists(token_file)
    assert ("127.0.0.1", port) not in _listening(os.getpid())
    assert threading.active_count() == threads


def test_cluster_refuses_every_interface() -> None:
    with pytest.raises(ValueError, match="every interface"):
        Cluster("0.0.0.0:0")


def test_wait_says_how_many_joined_and_how_to_join() -> None:
    with Cluster("127.0.0.1") as cluster, pytest.raises(TimeoutError, match=r"0 of 2 nodes joined .* Run `nbaccel-agent"):
        cluster.wait(nodes=2, timeout=0.3)


@pytest.mark.orphans  # the test kills a parent (an agent, or the kernel): its ranks end as our orphans
def test_nodes_list_host_address_ranks_gpus_and_liveness() -> None:
    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=2, nproc=3)
        try:
            nodes = cluster.wait(nodes=2, timeout=60)
            assert [(n.host, n.address, n.nproc, n.gpus, n.alive) for n in nodes] == [(socket.gethostname(), "127.0.0.1", 3, 0, True)] * 2
            assert "3 rank(s)" in repr(cluster)
            for node in nodes:  # wait() returned once each clock was measured: on loopback one clock, ~0 off
                assert node.clock.count >= JOIN_SAMPLES and node.clock.offset_ns is not None and node.clock.round_trip_ns is not None
                assert abs(node.clock.offset_ns) <= node.clock.round_trip_ns / 2 + 1, node.clock
            assert repr(cluster).count(" ms ± ") == 2 and cluster._repr_html_().count(" ms ± ") == 2  # each node's offset and uncertainty
            assert _eventually(lambda: all(n.clock.count >= JOIN_SAMPLES + 2 for n in nodes), scaled(3.0))  # a probe in each heartbeat
            agents[1].kill()
            agents[1].wait(5)
            alive = {agents[0].pid: True, agents[1].pid: False}  # nodes are listed in the order they joined
            assert _eventually(lambda: {n.pid: n.alive for n in cluster.nodes} == alive, 3.0)
        finally:
            cluster.close()
            stop_agents(agents)
        assert [a.returncode for a in agents][0] == 0  # cluster.close() ends the agents


def _where() -> tuple[int, int, int, int]:
    import os

    return int(os.environ["RANK"]), int(os.environ["NODE_RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])


def test_nodes_may_run_different_numbers_of_ranks() -> None:
    import nbaccel
    from nbaccel.testing import CollectingSink

    with Cluster("127.0.0.1:0") as cluster:
        first = start_agents(cluster, nodes=1, nproc=1)
        try:
            cluster.wait(nodes=1, timeout=60)
            second = start_agents(cluster, nodes=1, nproc=3)
            cluster.wait(nodes=2, timeout=60)
            values = nbaccel.notebook_launcher(_where, cluster=cluster, output=CollectingSink())
            assert values == [(0, 0, 0, 1), (1, 1, 0, 3), (2, 1, 1, 3), (3, 1, 2, 3)]
        finally:
            cluster.close()
            stop_agents(first + locals().get("second", []))


def test_an_agent_with_a_wrong_token_is_refused_with_one_clear_line(tmp_path) -> None:
    with Cluster("127.0.0.1:0") as cluster:
        wrong = write_token_file(new_secret(), str(tmp_path))
        run = subprocess.run(agent_argv(cluster.address, wrong), capture_output=True, text=True, timeout=30)
        assert run.returncode == EXIT_REFUSED
        assert run.stderr.count("\n") == 1 and run.stderr.startswith("nbaccel-agent: the cluster at") and "token" in run.stderr
        assert _eventually(lambda: any("bad signature" in r for r in cluster.refused), 2.0)
        assert "Refused 1 connection(s); last:" in repr(cluster) and "bad signature" in repr(cluster)
        assert cluster.nodes == []


def test_an_agent_without_a_token_or_with_a_bad_address_says_so() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NBACCEL_TOKEN"}
    run = subprocess.run(agent_argv("127.0.0.1:1", None), capture_output=True, text=True, timeout=30, env=env)
    assert run.returncode == EXIT_REFUSED and "--token-file" in run.stderr and run.stderr.count("\n") == 1
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env["NBACCEL_TOKEN"] = new_secret().hex()
    run = subprocess.run(agent_argv(f"127.0.0.1:{port}", None), capture_output=True, text=True, timeout=30, env=env)
    assert run.returncode == EXIT_UNREACHABLE and "cannot reach the cluster at" in run.stderr and run.stderr.count("\n") == 1


def _eventually(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())


def test_the_agent_is_a_console_script_with_help() -> None:
    import sys
    from pathlib import Path

    import tomllib

    from nbaccel.agent import cli

    project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["nbaccel-agent"] == "nbaccel.agent.cli:main" and callable(cli.main)
    run = subprocess.run([sys.executable, "-m", "nbaccel.agent", "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and "--nproc-per-node" in run.stdout and "--token-file" in run.stdout


_OTHER_VERSION_AGENT = """
import sys
import nbaccel._version
nbaccel._version.__version__ = "0.0.1"  # this node's nbaccel is another release
from nbaccel.agent.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_an_agent_of_another_nbaccel_version_is_refused_at_join_naming_both_versions() -> None:
    from nbaccel import __version__

    with Cluster("127.0.0.1:0") as cluster:
        argv = [sys.executable, "-c", _OTHER_VERSION_AGENT, *agent_argv(cluster.address, cluster.token_file)[3:]]
        run = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert run.returncode == EXIT_REFUSED, run.stderr
        assert run.stderr.count("\n") == 1 and "refused this node" in run.stderr, run.stderr
        assert f"nbaccel 0.0.1, this kernel runs nbaccel {__version__}" in run.stderr
        assert _eventually(lambda: any("nbaccel 0.0.1" in r for r in cluster.refused), 2.0)
        assert cluster.nodes == []
