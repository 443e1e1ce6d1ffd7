"""The notebook's side of the Ray tests: a Ray driver (as a kernel on the Ray head is) that starts
agents with ``cluster.start_agents(via="ray")``. Run by tests/agent/test_ray.py as its own process,
so the test process never becomes a Ray driver, and a kernel can die.

argv: SCENARIO RAY_ADDRESS. Lines to the test: ``ASK <what> <arg>`` (the test acts on its Ray
cluster, then answers with one line on stdin), and last ``REPORT <json>``.
Scenarios: ``lifecycle`` (a launch, a pool across cells, a node lost and rescheduled, close) and
``die`` (agents started, then the test kills this process), ``pending`` (bundles that do not fit), ``spread`` (``lifecycle`` on CPU
nodes, without the rescheduling: the namespaces' test), ``inspect`` (what Ray holds now).
argv[3], if given: the address the Cluster listens on (default 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import ray

import nbaccel
from nbaccel.testing import CollectingSink


def ask(what: str, arg: str = "-") -> str:
    print(f"ASK {what} {arg}", flush=True)
    return sys.stdin.readline().strip()


def where() -> dict[str, Any]:
    import os
    import socket

    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = __import__("torch").tensor([1.0])
    dist.all_reduce(total)
    return {"rank": int(os.environ["RANK"]), "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "host": socket.gethostname(), "sum": total.item()}


def ray_state() -> dict[str, Any]:
    """Every actor and placement group Ray knows of (through its control store: no dashboard)."""
    actors = ray._private.state.actors()  # type: ignore[attr-defined]
    groups = ray.util.placement_group_table()
    return {
        "actors": {a["ActorID"]: {"state": a["State"], "pid": a.get("Pid"), "class": a.get("ActorClassName")} for a in actors.values()},
        "groups": {g: value["state"] for g, value in groups.items()},
    }


def wait_for(condition: Any, timeout: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if condition():
            return round(time.monotonic() - started, 2)
        time.sleep(0.05)
    return None


def lifecycle(cluster: nbaccel.Cluster, report: dict[str, Any], gpus: int = 1, reschedule: bool = True) -> None:
    started = time.monotonic()
    (start,) = cluster.start_agents(via="ray", nodes=2, gpus_per_node=gpus, cpus_per_node=1, strategy="STRICT_SPREAD")
    cluster.wait(nodes=2, timeout=120)
    report["ready_s"] = round(time.monotonic() - started, 2)
    report["nodes"] = [(n.started_by, n.gpus, n.nproc) for n in cluster.nodes]
    report["addresses"] = sorted(n.address for n in cluster.nodes)
    table = ray.util.placement_group_table(start.group)
    report["bundle_nodes"] = [table["bundles_to_node_id"][i] for i in range(2)]
    report["agent_pids"] = [n.pid for n in cluster.nodes]
    report["launch"] = nbaccel.notebook_launcher(where, cluster=cluster, output=CollectingSink())
    pool = nbaccel.start_workers(cluster=cluster)
    pool.push(scale=10)
    report["pool"] = [pool.run(lambda: int(os.environ["RANK"])), pool.pull("scale", rank=1)]
    # A Ray node lost: the test kills the raylet of the bundle not on the Ray head, and says which.
    lost = int(ask("lose", ",".join(report["bundle_nodes"])))
    report["lost_after_s"] = wait_for(lambda: len(cluster.live_nodes) < 2, 30)
    report["lost_reason"] = [n.lost_reason for n in cluster.nodes if not n.alive]
    try:
        pool.run(lambda: 1)
    except nbaccel.PoolStoppedError as error:
        report["after_loss"] = str(error).splitlines()[0]
    pool.restart()
    report["after_restart"] = pool.run(lambda: int(os.environ["RANK"]))
    if reschedule:  # a new Ray node: Ray reschedules the lost bundle there and restarts its actor; its agent joins
        ask("add")
        pool.restart(wait_for=2, timeout=120)
        report["after_reschedule"] = pool.run(lambda: int(os.environ["RANK"]))
        report["rescheduled_on"] = ray.util.placement_group_table(start.group)["bundles_to_node_id"][lost]
    pool.stop()
    report["agent_pids"] += [n.pid for n in cluster.live_nodes]
    cluster.close()
    mine = [a._actor_id.hex() for a in start.actors]
    group = start.group.id.hex()
    report["closed_in_s"] = wait_for(lambda: all(ray_state()["actors"][a]["state"] == "DEAD" for a in mine) and ray_state()["groups"][group] == "REMOVED", 30)
    state = ray_state()
    report["after_close"] = {"actors": [state["actors"][a]["state"] for a in mine], "group": state["groups"][group]}
    report["actor_pids"] = [state["actors"][a]["pid"] for a in mine]


def die(cluster: nbaccel.Cluster, report: dict[str, Any]) -> None:
    (start,) = cluster.start_agents(via="ray", nodes=2, cpus_per_node=1, strategy="PACK")
    cluster.wait(nodes=2, timeout=120)
    pool = nbaccel.start_workers(cluster=cluster)
    rank_pids = pool.run(lambda: os.getpid())
    state = ray_state()
    actors = [a._actor_id.hex() for a in start.actors]
    facts = {"agents": [n.pid for n in cluster.nodes], "ranks": rank_pids, "actors": actors, "actor_pids": [state["actors"][a]["pid"] for a in actors]}
    facts["group"] = start.group.id.hex()
    ask("kill-me", json.dumps(facts, separators=(",", ":")))
    time.sleep(60)  # the test kills this process meanwhile


def pending(cluster: nbaccel.Cluster, report: dict[str, Any]) -> None:
    """Bundles the Ray cluster cannot hold (4 GPUs a node): the wait says so, close removes the group."""
    (start,) = cluster.start_agents(via="ray", nodes=2, gpus_per_node=4, cpus_per_node=1)
    try:
        cluster.wait(nodes=2, timeout=5)
    except TimeoutError as error:
        report["timeout"] = str(error)
    cluster.close()
    group, actors = start.group.id.hex(), [a._actor_id.hex() for a in start.actors]
    report["closed_in_s"] = wait_for(lambda: ray_state()["groups"][group] == "REMOVED" and all(ray_state()["actors"][a]["state"] == "DEAD" for a in actors), 30)


def main() -> None:
    scenario, address = sys.argv[1], sys.argv[2]
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"  # the Cluster's address: the head's, seen from the Ray nodes
    ray.init(address=address, log_to_driver=False)
    report: dict[str, Any] = {}
    if scenario == "inspect":
        report = ray_state()
    else:
        scenarios = {"lifecycle": lifecycle, "die": die, "spread": lambda c, r: lifecycle(c, r, gpus=0, reschedule=False), "pending": pending}
        with nbaccel.Cluster(f"{host}:0") as cluster:
            scenarios[scenario](cluster, report)
    ray.shutdown()
    print("REPORT " + json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
