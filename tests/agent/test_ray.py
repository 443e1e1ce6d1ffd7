"""Agents started through a real Ray cluster: two Ray nodes on this machine (``ray.cluster_utils``:
separate raylets and node ids), the notebook's side a Ray driver process (tests/agent/ray_kernel.py).

A launch and a pool across the two nodes' agents, a Ray node lost (its raylet killed) and its bundle
rescheduled on a new node, close leaving no actor and no placement group, and a kernel that dies
taking its actors, agents and ranks along. The Ray cluster is this module's; it is shut down at the
end and every Ray process is gone (the leak check holds each test to it too).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from nbaccel.testing import scaled

ray = pytest.importorskip("ray", reason='Ray is the optional extra nbaccel[ray]: pip install "nbaccel[ray]"')
from ray.cluster_utils import Cluster as RayCluster  # noqa: E402 - only once Ray is known to be there

ROOT = Path(__file__).resolve().parents[2]
KERNEL = Path(__file__).with_name("ray_kernel.py")
# orphans: a killed raylet's workers, and the agents of killed actors, are reparented to this
# (subreaping) test process; they are reaped here, and every live one still counts.
pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.orphans, pytest.mark.timeout(scaled(300))]

_NODE = {"num_cpus": 2, "num_gpus": 1, "object_store_memory": 80 * 2**20}  # 1 GPU each: Ray's own bookkeeping (no device)
# The GCS notices a killed raylet within ~1.5 s (default: 15 s), so a lost bundle is rescheduled at once.
_FAST_HEALTH: dict[str, Any] = {"health_check_period_ms": 500, "health_check_failure_threshold": 3, "health_check_initial_delay_ms": 0}
# No idle workers kept for later jobs: a test's workers end with its driver (the leak check sees them).
_FAST_HEALTH |= {"enable_worker_prestart": False, "num_workers_soft_limit": 0}


def _ray_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]


@pytest.fixture
def workers_end() -> Iterator[None]:
    """After the test: every process Ray started for it (its driver's workers and actors) ends."""
    before = {p.pid for p in _ray_processes()}
    yield
    deadline = time.monotonic() + scaled(20)
    while (left := [p.pid for p in _ray_processes() if p.pid not in before]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes Ray started for the test still run: {left}"


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayCluster]:
    cluster = RayCluster(initialize_head=True, connect=False, head_node_args={**_NODE, "include_dashboard": False, "_system_config": _FAST_HEALTH})
    try:
        cluster.add_node(**_NODE)
        cluster.wait_for_nodes(timeout=scaled(60))
        yield cluster
    finally:
        cluster.shutdown()
    left = [p.pid for p in _ray_processes() if p.is_running() and "ray" in " ".join(p.cmdline()).lower()]
    assert not left, f"Ray processes left after shutdown: {left}"


class Kernel:
    """A Ray driver process running one scenario of ray_kernel.py, answering its ASK lines."""

    def __init__(self, scenario: str, address: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": address}
        self.process = subprocess.Popen(
            [sys.executable, str(KERNEL), scenario, address],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        self.said: list[str] = []

    def next_ask(self) -> tuple[str, str] | None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.said.append(line.rstrip())
            if line.startswith("ASK "):
                _, what, arg = line.rstrip("\n").split(" ", 2)
                return what, arg
            if line.startswith("REPORT "):
                return None
        return None

    def answer(self, line: str = "ok") -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def report(self, timeout: float) -> dict[str, Any]:
        code = self.process.wait(timeout)
        assert self.process.stderr is not None and self.process.stdout is not None
        errors = self.process.stderr.read()
        self.said += self.process.stdout.read().splitlines()
        lines = [line for line in self.said if line.startswith("REPORT ")]
        assert code == 0 and lines, f"the kernel failed ({code}):\n" + "\n".join(self.said[-20:]) + "\n" + errors[-5000:]
        self.close()
        return dict(json.loads(lines[-1].removeprefix("REPORT ")))

    def close(self) -> None:
        for stream in (self.process.stdin, self.process.stdout, self.process.stderr):
            if stream is not None:
                stream.close()
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


def _node_of(cluster: RayCluster, node_id: str) -> Any:
    return next(node for node in cluster.list_all_nodes() if node.node_id == node_id)


def _gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
        if not left:
            return []
        time.sleep(0.1)
    return left


@pytest.mark.usefixtures("workers_end")
def test_a_launch_a_pool_a_lost_ray_node_and_close_leave_nothing_in_ray(ray_cluster: RayCluster) -> None:
    kernel = Kernel("lifecycle", ray_cluster.address)
    added = []
    try:
        while (asked := kernel.next_ask()) is not None:
            what, arg = asked
            if what == "lose":  # the bundle not on the head (the head's raylet holds the Ray cluster's control store)
                lost = next(i for i, node in enumerate(arg.split(",")) if node != ray_cluster.head_node.node_id)
                ray_cluster.remove_node(_node_of(ray_cluster, arg.split(",")[lost]), allow_graceful=False)  # its raylet killed
                kernel.answer(str(lost))
            elif what == "add":
                added.append(ray_cluster.add_node(**_NODE))
                kernel.answer()
        report = kernel.report(scaled(120))
    finally:
        kernel.close()
        for node in added:
            ray_cluster.remove_node(node)
    # One agent per Ray node, started by the placement group; one rank each (no device on this machine).
    assert [n[0] for n in report["nodes"]] == [report["nodes"][0][0]] * 2 and report["nodes"][0][0].startswith("ray placement group ")
    assert len(set(report["bundle_nodes"])) == 2  # STRICT_SPREAD: two Ray nodes
    # Each rank sees the GPU Ray assigned to its bundle, and gloo ran across both nodes.
    assert [(v["rank"], v["cuda"], v["sum"]) for v in report["launch"]] == [(0, "0", 2.0), (1, "0", 2.0)]
    assert report["pool"] == [[0, 1], 10]
    assert report["lost_after_s"] is not None and report["lost_after_s"] < scaled(5)
    assert report["lost_reason"] == ["its connection closed (the agent or its machine stopped)"]
    assert " was lost: " in report["after_loss"] and "its ranks" in report["after_loss"]
    assert report["after_restart"] == [0]  # on the node left
    assert report["after_reschedule"] == [0, 1]  # the bundle rescheduled on the new node, its actor restarted
    assert report["rescheduled_on"] == added[0].node_id
    assert report["after_close"] == {"actors": ["DEAD", "DEAD"], "group": "REMOVED"}
    assert _gone(report["agent_pids"] + [p for p in report["actor_pids"] if p], scaled(10)) == []


@pytest.mark.usefixtures("workers_end")
def test_a_dead_kernel_takes_its_actors_agents_and_ranks_along(ray_cluster: RayCluster) -> None:
    kernel = Kernel("die", ray_cluster.address)
    try:
        asked = kernel.next_ask()
        assert asked is not None and asked[0] == "kill-me", kernel.said
        facts = json.loads(asked[1])
        kernel.process.kill()  # the kernel dies (SIGKILL: no atexit, no close)
        kernel.process.wait(10)
    finally:
        kernel.close()
    assert _gone(facts["agents"] + facts["ranks"] + facts["actor_pids"], scaled(20)) == []
    inspect = Kernel("inspect", ray_cluster.address)
    try:
        inspect.next_ask()
        state = inspect.report(scaled(60))
    finally:
        inspect.close()
    assert [state["actors"][a]["state"] for a in facts["actors"]] == ["DEAD", "DEAD"]
    assert state["groups"][facts["group"]] == "REMOVED"


@pytest.mark.usefixtures("workers_end")
def test_bundles_the_ray_cluster_cannot_hold_are_said_while_waiting_and_removed_at_close(ray_cluster: RayCluster) -> None:
    kernel = Kernel("pending", ray_cluster.address)
    try:
        assert kernel.next_ask() is None
        report = kernel.report(scaled(60))
    finally:
        kernel.close()
    said = [line for line in kernel.said if line.startswith("nbaccel: waiting for ray placement group ")]
    assert said and "PENDING (2 x {'CPU': 1, 'GPU': 4}, STRICT_SPREAD; the Ray cluster has " in said[0], kernel.said
    assert report["timeout"].startswith("0 of 2 nodes joined the cluster at ") and ": PENDING (" in report["timeout"]
    assert report["closed_in_s"] is not None
