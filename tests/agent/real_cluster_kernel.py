"""The notebook's side of the real-cluster tests, run on the fabric's login side (10.232.0.1).

argv: SCENARIO (ssh | slurm-alloc | slurm-submit) SSH_CONFIG. Agents start only through
``cluster.start_agents``. Prints one JSON report for tests/agent/test_real_clusters.py, with the
times it measured (the benchmark reads them too).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import nbaccel
from nbaccel import Cluster
from nbaccel.cluster.cluster import AgentStartError
from nbaccel.cluster.group import layout
from nbaccel.cluster.workers import NodeLostPoolError
from nbaccel.testing import CollectingSink

HOST = "10.232.0.1"


def where() -> dict[str, Any]:
    import os
    import socket

    with open("/proc/self/environ", "rb") as mine, open(f"/proc/{os.getppid()}/environ", "rb") as agents:
        seen = b"NBACCEL_TOKEN" in mine.read() + agents.read()
    return {
        "rank": int(os.environ["RANK"]),
        "node_rank": int(os.environ["NODE_RANK"]),
        "host": socket.gethostname(),
        "token_env": seen or "NBACCEL_TOKEN" in os.environ,
    }


def all_reduce() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank() + 1])
    dist.all_reduce(total)
    dist.destroy_process_group()
    return int(total.item())


def hold(seconds: float) -> int:
    import os
    import time

    time.sleep(seconds)
    return int(os.environ["RANK"])


def token_in_argv(secret: str) -> list[int]:
    """Every process on this machine (the "nodes" included) whose command line holds the secret."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    if secret.encode() in cmdline.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def timed(report: dict[str, Any], name: str, action: Any) -> Any:
    started = time.monotonic()
    value = action()
    report.setdefault("times", {})[name] = round(time.monotonic() - started, 3)
    return value


def launches(cluster: Cluster, report: dict[str, Any]) -> None:
    report["nodes"] = [{"host": n.host, "address": n.address, "gpus": n.gpus, "started_by": n.started_by, "order": n.order} for n in cluster.nodes]
    report["layout"] = [slot.node.host for slot in layout(cluster.live_nodes, cluster.host)]
    report["where"] = timed(report, "first_launch", lambda: nbaccel.notebook_launcher(where, cluster=cluster, output=CollectingSink()))
    report["all_reduce"] = timed(report, "warm_launch", lambda: nbaccel.notebook_launcher(all_reduce, cluster=cluster, output=CollectingSink()))
    warm = []
    for _ in range(5):
        started = time.monotonic()
        nbaccel.notebook_launcher(hold, (0.0,), cluster=cluster, output=CollectingSink())
        warm.append(round(time.monotonic() - started, 3))
    report["times"]["warm_launches"] = warm


def interrupt(cluster: Cluster, report: dict[str, Any]) -> None:
    threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    try:
        nbaccel.notebook_launcher(hold, (60.0,), cluster=cluster, output=CollectingSink())
        report["interrupt"] = "not interrupted"
    except KeyboardInterrupt:
        report["interrupt"] = round(time.monotonic() - started - 1.5, 2)
    report["after_interrupt"] = nbaccel.notebook_launcher(hold, (0.0,), cluster=cluster, output=CollectingSink())


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if os.path.exists(f"/proc/{pid}") and "Z" not in open(f"/proc/{pid}/stat").read().split()[2]]


def node_loss(cluster: Cluster, report: dict[str, Any], replace: Any) -> None:
    """A pool, a node killed under it, restart on the survivor, then on a replacement."""
    pool = nbaccel.start_workers(cluster=cluster, start_timeout=120)
    pool.push(scale=10)
    report["pool"] = [pool.run(lambda: int(__import__("os").environ["RANK"]), output=CollectingSink()), pool.pull("scale", rank=3)]
    group = pool._group
    pids = {r: group.pid(r) for r in range(pool.num_processes)}  # type: ignore[union-attr]
    victim = next(slot for slot in group.slots if slot.node_rank == 1)  # type: ignore[union-attr]
    os.kill(victim.node.pid, signal.SIGKILL)  # its agent: the node is gone
    lost_ranks, kept_ranks = victim.ranks, [r for r in pids if r not in victim.ranks]
    deadline = time.monotonic() + 10
    while not pool.lost and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        pool.run(lambda: 1, output=CollectingSink())
        report["after_loss"] = "ran"
    except NodeLostPoolError as error:
        report["after_loss"] = str(error)
    report["kept_alive"] = alive([pids[r] for r in kept_ranks]) == [pids[r] for r in kept_ranks]
    report["status_after_loss"] = [s.state for s in pool.status()]
    report["stacks_after_loss"] = [s.rank for s in pool.stacks()]
    deadline = time.monotonic() + 5
    while alive([pids[r] for r in lost_ranks]) and time.monotonic() < deadline:
        time.sleep(0.05)
    report["lost_ranks_left"] = alive([pids[r] for r in lost_ranks])
    timed(report, "restart_survivors", pool.restart)
    report["after_restart"] = pool.run(lambda: int(__import__("os").environ["RANK"]), output=CollectingSink())
    report["survivors_left"] = alive([pids[r] for r in kept_ranks])
    replace()
    timed(report, "restart_with_replacement", lambda: pool.restart(wait_for=2, timeout=60))
    report["after_replacement"] = pool.run(lambda: int(__import__("os").environ["RANK"]), output=CollectingSink())
    pool.stop()


def ssh_scenario(ssh_config: str, report: dict[str, Any]) -> None:
    hosts = ["node1", "node2"]
    with Cluster(f"{HOST}:0", token_dir=tempfile.mkdtemp()) as broken:  # the doc's old recipe: not on the remote PATH
        broken.start_agents(via="ssh", hosts=hosts, ssh_config=ssh_config, agent="nbaccel-agent")
        started = time.monotonic()
        try:
            broken.wait(nodes=2, timeout=60)
        except AgentStartError as error:
            report["missing_agent"] = [str(error), round(time.monotonic() - started, 2)]
    cluster = Cluster(f"{HOST}:0")
    secret = Path(cluster.token_file).read_text().strip()
    report["token_dir_mode"] = oct(os.stat(os.path.dirname(cluster.token_file)).st_mode & 0o777)
    started = time.monotonic()
    cluster.start_agents(via="ssh", hosts=hosts, ssh_config=ssh_config, nproc_per_node=2)
    cluster.wait(nodes=2, timeout=60)
    report.setdefault("times", {})["ready"] = round(time.monotonic() - started, 3)
    try:
        launches(cluster, report)
        report["token_in_argv"] = token_in_argv(secret)
        interrupt(cluster, report)
        node_loss(cluster, report, lambda: cluster.start_agents(via="ssh", hosts=["node2"], ssh_config=ssh_config, nproc_per_node=2))
    finally:
        ssh = [s.process for s in cluster.starts]  # type: ignore[attr-defined]
        timed(report, "close", cluster.close)
        report["ssh_left"] = [p.pid for p in ssh if p.poll() is None]
    magic_scenario(ssh_config, report)


def magic_scenario(ssh_config: str, report: dict[str, Any]) -> None:
    """The same from cells: %distributed cluster, a pool on it, a pulled value, stop, close."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "nbaccel")
    cells = [
        f"%distributed cluster {HOST} --via ssh --hosts node1 node2 --ssh-config {ssh_config} --nproc-per-node 1 -o nodes",
        "%distributed start --cluster nodes",
        "%%distributed\nimport socket\nhost = socket.gethostname()",
        "%distributed pull host --rank 1 -o second",
        "%distributed stop",
        "nodes.close()",
    ]
    for code in cells:
        result = shell.run_cell(code)
        if not result.success:
            report["magic"] = f"{code!r} failed: {result.error_in_exec or result.error_before_exec!r}"
            shell.user_ns["nodes"].close()
            return
    report["magic"] = [shell.user_ns["second"], [n.started_by for n in shell.user_ns["nodes"].nodes]]


def slurm_scenario(submit: bool, report: dict[str, Any]) -> None:
    cluster = Cluster(f"{HOST}:0")
    said = io.StringIO()
    started = time.monotonic()
    if submit:
        starts = cluster.start_agents(via="slurm", nodes=2, nproc_per_node=2, time="00:10:00")
    else:
        bad = cluster.start_agents(via="slurm", agent="/nonexistent/nbaccel-agent")
        try:
            cluster.wait(nodes=2, timeout=60)
        except AgentStartError as error:
            report["missing_agent"] = [str(error), round(time.monotonic() - started, 2)]
        cluster.starts.remove(bad[0])
        bad[0].stop(1.0)
        started = time.monotonic()
        starts = cluster.start_agents(via="slurm", nproc_per_node=2)
    with contextlib.redirect_stdout(said):
        cluster.wait(nodes=2, timeout=90)
    report.setdefault("times", {})["ready"] = round(time.monotonic() - started, 3)
    report["said_while_waiting"] = said.getvalue().splitlines()
    try:
        launches(cluster, report)
        if submit:
            interrupt(cluster, report)
    finally:
        job = getattr(starts[0], "job", os.environ.get("SLURM_JOB_ID"))
        timed(report, "close", cluster.close)
        report["job"] = job
        if submit:
            import subprocess

            report["job_after_close"] = subprocess.run(["squeue", "-h", "-j", str(job), "-o", "%T"], capture_output=True, text=True).stdout.strip()


def main() -> None:
    scenario, ssh_config = sys.argv[1], sys.argv[2]
    report: dict[str, Any] = {"scenario": scenario, "kernel_host": socket.gethostname()}
    if scenario == "ssh":
        ssh_scenario(ssh_config, report)
    else:
        slurm_scenario(scenario == "slurm-submit", report)
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
