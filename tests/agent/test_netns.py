"""Two "machines": each agent in its own network namespace, joined by a veth pair (root only).

The kernel and node 0 run in namespace 0 (10.231.0.1), node 1 in namespace 1 (10.231.0.2).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent import netns

ROOT = Path(__file__).resolve().parents[2]
REASON = netns.available()
pytestmark = [pytest.mark.skipif(REASON is not None, reason=f"network namespaces: {REASON}"), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def net() -> Iterator[netns.Namespaces]:
    with netns.two_namespaces() as namespaces:
        yield namespaces


def _run_in_ns0(net: netns.Namespaces, *argv: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([*net.exec_in(0), sys.executable, *argv], capture_output=True, text=True, timeout=100, env=env, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_the_two_node_example_runs_across_namespaces(net: netns.Namespaces) -> None:
    ns1 = " ".join(net.exec_in(1))
    summary = _run_in_ns0(net, "examples/08_two_nodes.py", f"{net.addresses[0]}:0", "--node", "", "--node", ns1)
    assert [n[1] for n in summary["nodes"]] == list(net.addresses)
    assert [(v["rank"], v["node"], v["sum"]) for v in summary["values"]] == [(0, 0, 6.0), (1, 0, 6.0), (2, 1, 6.0), (3, 1, 6.0)]
    assert [v["gloo_interface"] for v in summary["values"]] == [net.veths[0]] * 2 + [net.veths[1]] * 2
    assert summary["error"]["headline"].startswith("rank 3 on node 1 (") and net.addresses[1] in summary["error"]["headline"]
    # A peer's "connection closed" may reach the kernel before rank 3's own error (another node's
    # path): that peer then counts as failed too, but never as the root cause.
    assert summary["error"]["statuses"][3] == "failed" and set(summary["error"]["statuses"][:3]) <= {"stopped", "failed"}
    assert summary["agent_exit_codes"] == [0, 0]


def test_sockets_stay_on_the_namespace_addresses_and_a_cut_network_loses_the_node(net: netns.Namespaces) -> None:
    ns1 = " ".join(net.exec_in(1))
    cut = f"{ns1} ip link set {net.veths[1]} down"
    report = _run_in_ns0(net, "tests/agent/netns_kernel.py", net.addresses[0], ns1, cut)
    assert report["nodes"] == list(net.addresses) and report["values"] == [0, 1, 2, 3]
    hosts = {address.rsplit(":", 1)[0] for address in report["listening"]}
    assert hosts <= set(net.addresses) and len(report["listening"]) >= 6, report["listening"]
    assert report["failed_after_cut_s"] < 5.0
    assert "node 1 (" in report["error"] and net.addresses[1] in report["error"] and "NodeLostError" in report["error"]
    assert report["statuses"][:2] == ["stopped", "stopped"] and report["statuses"][2:] == ["failed", "failed"]
    assert report["cut_agent_exit"][0] == 4 and report["cut_agent_exit"][1] < 12.0  # kernel unreachable for 10 s
    assert "silent for 10 s" in report["cut_agent_said"][0]
