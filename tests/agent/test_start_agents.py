"""``cluster.start_agents`` on this machine: a command template as the starting command, early failures, the token's places.

The real ssh and Slurm starts are tested against real daemons in test_real_clusters.py (root);
these run anywhere: the template's command is ``sh``, which runs the agent here on loopback.

Imports internals (agent.node, cluster.cluster, cluster.group, cluster.starters, net, net.link, net.signing): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import nbaccel
from nbaccel import Cluster
from nbaccel.cluster.cluster import AgentStartError
from nbaccel.cluster.group import layout
from nbaccel.cluster.starters import AgentStart, check_starts
from nbaccel.testing import CollectingSink, scaled
from tests.agent.harness import agent_argv, stop_agents

SH = "sh -c 'exec \"$@\"' {host} {agent}"  # "runs on host" {host}: here, on this machine


def token_env_seen() -> bool:
    import os

    with open("/proc/self/environ", "rb") as mine, open(f"/proc/{os.getppid()}/environ", "rb") as agents:
        return b"NBACCEL_TOKEN" in mine.read() + agents.read() or "NBACCEL_TOKEN" in os.environ


def processes_holding(secret: str) -> list[int]:
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            if secret.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


def test_a_command_template_starts_agents_in_the_order_of_its_hosts() -> None:
    with Cluster("127.0.0.1:0", token_dir=tempfile.gettempdir()) as cluster:
        starts = cluster.start_agents(via=SH, hosts=["first", "second"], agent=[sys.executable, "-m", "nbaccel.agent"], nproc_per_node=1)
        cluster.wait(nodes=2, timeout=scaled(60))
        assert processes_holding(Path(cluster.token_file).read_text().strip()) == []  # the secret went on stdin
        assert sorted(n.started_by for n in cluster.nodes) == ["sh first", "sh second"]
        assert [slot.node.started_by for slot in layout(cluster.live_nodes, cluster.host)] == ["sh first", "sh second"]
        assert nbaccel.notebook_launcher(token_env_seen, cluster=cluster, output=CollectingSink()) == [False, False]
        assert "sh first, alive" in repr(cluster)
    assert all(start.process.poll() is not None for start in starts)  # type: ignore[attr-defined]  # closing ended them


def test_a_launcher_that_ends_before_its_agent_joined_fails_wait_at_once() -> None:
    failing = "sh -c 'echo \"bash: nbaccel-agent: command not found\" >&2; exit 127' {host} {agent}"
    with Cluster("127.0.0.1:0", token_dir=tempfile.gettempdir()) as cluster:
        cluster.start_agents(via=failing, hosts=["node2"])
        started = time.monotonic()
        with pytest.raises(AgentStartError, match=r"^sh node2 ended with exit code 127 before its agent joined: bash: nbaccel-agent: command not found$"):
            cluster.wait(nodes=1, timeout=60)
        assert time.monotonic() - started < scaled(2)


def test_an_agent_given_the_token_in_its_environment_drops_it_before_any_rank_starts() -> None:
    with Cluster("127.0.0.1:0", token_dir=tempfile.gettempdir()) as cluster:
        secret = Path(cluster.token_file).read_text().strip()
        agent = subprocess.Popen(agent_argv(cluster.address, None, 2), env={**os.environ, "NBACCEL_TOKEN": secret}, text=True)
        try:
            cluster.wait(nodes=1, timeout=scaled(60))
            assert b"NBACCEL_TOKEN" not in Path(f"/proc/{cluster.nodes[0].pid}/environ").read_bytes()
            assert nbaccel.notebook_launcher(token_env_seen, cluster=cluster, output=CollectingSink()) == [False, False]
        finally:
            cluster.close()
            stop_agents([agent])


def test_the_token_goes_to_a_private_folder_in_the_home_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with Cluster("127.0.0.1:0") as cluster:
        folder = tmp_path / ".nbaccel" / "clusters"
        assert Path(cluster.token_file).parent == folder
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
        assert stat.S_IMODE(os.stat(cluster.token_file).st_mode) == 0o600
    assert not Path(cluster.token_file).exists()
    with Cluster("127.0.0.1:0", token_dir=tempfile.gettempdir()) as local:
        assert Path(local.token_file).parent == Path(tempfile.gettempdir())


@pytest.mark.parametrize(
    ("via", "options", "message"),
    [
        ("ssh", {}, r"via='ssh' starts one agent per host: give hosts="),
        ("kubectl exec -i {host} --", {"hosts": ["pod"]}, r"neither 'ssh', 'slurm', 'ray' nor a command template with an \{agent\} word"),
        ("slurm", {"hosts": ["a"]}, r"give nodes=N, not hosts"),
    ],
)
def test_start_agents_refuses_what_cannot_work(via: str, options: dict[str, object], message: str) -> None:
    with Cluster("127.0.0.1:0", token_dir=tempfile.gettempdir()) as cluster, pytest.raises(ValueError, match=message):
        cluster.start_agents(via=via, **options)  # type: ignore[arg-type]


def test_slurm_from_a_login_node_needs_a_node_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with Cluster("127.0.0.1:0", token_dir=tempfile.gettempdir()) as cluster, pytest.raises(ValueError, match=r"submits a job: say how many nodes \(nodes=2\)"):
        cluster.start_agents(via="slurm")


class _Ended(AgentStart):
    """A start whose starting command ended (with the label of a node that joined, then was lost)."""

    def __init__(self, label: str, started_at: float) -> None:
        self.label, self.expected, self.started_at = label, 1, started_at

    def failure(self) -> str | None:
        return f"{self.label} ended"

    def stop(self, grace: float) -> None:
        pass


def test_a_replacement_with_a_lost_nodes_label_is_still_watched() -> None:
    first, replacement = _Ended("ssh node2", 1.0), _Ended("ssh node2", 5.0)
    check_starts([first], [("ssh node2", 2.0)], {})  # its agent joined (then was lost): not a failure
    with pytest.raises(AgentStartError, match="^ssh node2 ended$"):
        check_starts([first, replacement], [("ssh node2", 2.0)], {})  # the old node does not count for the new start


def test_a_message_that_arrives_with_the_welcome_is_not_lost() -> None:
    """start_agents, wait() and a launch at once: the launch may reach the agent in the same read
    as its welcome. Here a close comes in the welcome's very packet: the agent must act on it."""
    import socket
    import threading

    from nbaccel.agent.node import EXIT_OK, NodeAgent
    from nbaccel.net import protocol
    from nbaccel.net.link import Link, new_nonce
    from nbaccel.net.signing import new_secret

    secret, listener = new_secret(), socket.create_server(("127.0.0.1", 0))
    agent = NodeAgent(f"127.0.0.1:{listener.getsockname()[1]}", secret, nproc_per_node=1)
    result: list[int] = []
    thread = threading.Thread(target=lambda: result.append(agent.run()))
    thread.start()
    try:
        conn, _ = listener.accept()
        nonce = new_nonce()
        link = Link(conn, secret, sender="kernel", session=nonce)
        link.verifier.session = None
        link.send(protocol.HELLO)
        join = []
        while not join:
            join = link.receive()
        link.start_session(str(join[0].header["session"]))
        conn.sendall(link.signer.seal(protocol.WELCOME, {"node": "0"}) + link.signer.seal(protocol.CLOSE))  # one packet
        thread.join(scaled(5))  # well before the 10 s the agent waits for a silent kernel
        assert result == [EXIT_OK]
    finally:
        listener.close()
        thread.join(15)
        link.close()
