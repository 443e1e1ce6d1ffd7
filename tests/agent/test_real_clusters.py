"""The recipes of docs/multinode.md against a real sshd and a real Slurm 22.05, nodes in network namespaces.

scripts/cluster_fabric.py makes the "machines" (one sshd and one slurmd per namespace, munge,
slurmctld, name look-ups from files only); tests/agent/real_cluster_kernel.py is the notebook's
side, run on the fabric's login address. Agents start only through ``cluster.start_agents``. One
fabric serves the module; each scenario runs once and its tests read its report.
Skipped, with the reason, where not root or where the daemons are not installed
(scripts/install-cluster-deps.sh installs them; ``./dev test`` runs it).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nbaccel.testing import scaled
from tests.leak_check import reap_zombie_children

ROOT = Path(__file__).resolve().parents[2]
KERNEL = Path(__file__).with_name("real_cluster_kernel.py")
# orphans: the agents an sshd session or slurmstepd started are reparented to this (subreaping)
# test process when their session ends; they are reaped here, and every live one still counts.
pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.orphans, pytest.mark.timeout(scaled(600))]


def _fabric_module() -> Any:
    spec = importlib.util.spec_from_file_location("cluster_fabric", ROOT / "scripts" / "cluster_fabric.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fabric_module = _fabric_module()
REASON = fabric_module.unavailable()


@pytest.fixture(scope="module")
def fabric() -> Iterator[Any]:
    if REASON:
        pytest.skip(REASON)
    with fabric_module.Fabric(nodes=2) as made:
        yield made
    assert not Path(made.dir).exists()
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    assert f"nbf{made.tag}" not in left


_reports: dict[str, dict[str, Any]] = {}


def report_of(fabric: Any, scenario: str) -> dict[str, Any]:
    if scenario not in _reports:
        argv = [sys.executable, str(KERNEL), scenario, fabric.ssh_config]
        if scenario == "slurm-alloc":  # the notebook inside an allocation (as on a node of a salloc job)
            argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", *argv]
        done = subprocess.run(fabric.in_ctl(argv), capture_output=True, text=True, env=fabric.env(), timeout=scaled(300))
        lines = [line for line in done.stdout.splitlines() if line.startswith("REPORT ")]
        assert done.returncode == 0 and lines, f"{scenario} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        _reports[scenario] = json.loads(lines[-1].removeprefix("REPORT "))
        reap_zombie_children()
    return _reports[scenario]


def check_launches(report: dict[str, Any], first_host: str | None) -> None:
    where = report["where"]
    assert [w["rank"] for w in where] == [0, 1, 2, 3]
    assert {w["host"] for w in where} == {"node1", "node2"}  # the ranks ran on both "machines"
    assert [w["node_rank"] for w in where] == [0, 0, 1, 1]
    if first_host is not None:
        assert where[0]["host"] == first_host
    assert not any(w["token_env"] for w in where)  # no rank, and no agent, holds NBACCEL_TOKEN
    assert report["all_reduce"] == [10, 10, 10, 10]  # gloo across the namespaces


def test_ssh_agent_missing_fails_wait_at_once_with_sshs_words(fabric: Any) -> None:
    message, took = report_of(fabric, "ssh")["missing_agent"]
    assert "ended with exit code 127 before its agent joined" in message
    assert "nbaccel-agent: command not found" in message
    assert took < scaled(10)  # not the 60 s timeout


def test_ssh_starts_agents_launches_and_interrupts(fabric: Any) -> None:
    report = report_of(fabric, "ssh")
    assert sorted(n["started_by"] for n in report["nodes"]) == ["ssh node1", "ssh node2"]
    assert sorted(n["address"] for n in report["nodes"]) == fabric.addresses
    check_launches(report, first_host="node1")  # node ranks follow the hosts given
    assert report["token_in_argv"] == []  # the secret went on ssh's stdin: in no process's argv
    assert report["token_dir_mode"] == "0o700"
    assert report["interrupt"] < scaled(5)
    assert report["after_interrupt"] == [0, 1, 2, 3]
    assert report["ssh_left"] == []  # closing the cluster ended every ssh session


def test_pool_outlives_a_lost_node_and_restarts(fabric: Any) -> None:
    report = report_of(fabric, "ssh")
    assert report["pool"] == [[0, 1, 2, 3], 10]
    assert report["after_loss"].startswith("node 1 (node2, 10.232.0.12) was lost")
    assert "its ranks 2, 3 ended with it" in report["after_loss"]
    assert report["kept_alive"] is True  # the survivors are kept for inspection
    assert report["status_after_loss"] == ["idle", "idle", "lost with node 1", "lost with node 1"]
    assert report["stacks_after_loss"] == [0, 1]
    assert report["lost_ranks_left"] == []  # nothing of the lost node's ranks runs anywhere
    assert report["after_restart"] == [0, 1]  # back on the node still there
    assert report["survivors_left"] == []
    assert report["after_replacement"] == [0, 1, 2, 3]  # wait_for=2 once a new agent joined


def test_the_magic_makes_the_cluster_and_runs_cells_on_it(fabric: Any) -> None:
    second, started_by = report_of(fabric, "ssh")["magic"]
    assert second == "node2"  # %distributed pull host --rank 1: the second host's rank
    assert sorted(started_by) == ["ssh node1", "ssh node2"]


def test_slurm_inside_an_allocation(fabric: Any) -> None:
    report = report_of(fabric, "slurm-alloc")
    message, took = report["missing_agent"]
    assert "before its agent joined" in message and "/nonexistent/nbaccel-agent: No such file or directory" in message
    assert took < scaled(10)
    assert [n["started_by"] for n in report["nodes"]] == [f"slurm job {report['job']}"] * 2
    assert report["layout"] == ["node1", "node2"]  # Slurm's node order, whatever the join order
    check_launches(report, first_host="node1")


def test_slurm_by_submission_says_where_it_is_queued_and_close_ends_the_job(fabric: Any) -> None:
    report = report_of(fabric, "slurm-submit")
    assert report["said_while_waiting"] and all(line.startswith(f"nbaccel: waiting for slurm job {report['job']}: ") for line in report["said_while_waiting"])
    assert report["layout"] == ["node1", "node2"]
    check_launches(report, first_host="node1")
    assert report["interrupt"] < scaled(5)
    assert report["job_after_close"] == ""  # the job is gone from the queue


def test_names_resolve_from_files_only_inside_the_fabric(fabric: Any) -> None:
    """The nodes' names come from the fabric's /etc/hosts; an unknown name fails at once (no DNS
    server is asked: a query to resolv.conf's 127.0.0.1 would wait out its 1 s timeout), and no
    namespace has a route out of the fabric."""
    known = subprocess.run(fabric.in_ctl(["getent", "hosts", "node2", "10.232.0.11"]), capture_output=True, text=True, timeout=30)
    assert known.stdout.split() == ["10.232.0.12", "node2", "10.232.0.11", "node1"]
    started = time.monotonic()
    unknown = subprocess.run(fabric.in_ctl(["getent", "ahosts", "nbaccel-nowhere.example"]), capture_output=True, text=True, timeout=30)
    assert unknown.returncode == 2 and time.monotonic() - started < 0.9
    for netns in [fabric.ctl, *fabric.namespaces]:
        routes = subprocess.run(["ip", "-n", netns, "route"], capture_output=True, text=True, timeout=30).stdout
        assert "default" not in routes
