"""The notebook's side of benchmarks/ray_start_bench.py, run on the Ray head's namespace.

argv: RAY_ADDRESS HEAD_ADDRESS SSH_CONFIG ROUNDS WARM_RUNS. For each round and each way (ssh,
ray): a fresh Cluster, ``start_agents`` to ``wait(nodes=2)`` ("ready"), the first launch, then
warm launches (gloo init + all_reduce, 2 nodes x 1 rank), close. Prints ``SAMPLES <json>``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import ray

from nbaccel import Cluster, notebook_launcher
from nbaccel.testing import CollectingSink


def gloo_all_reduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    return total.item()


def one_round(via: str, host: str, ssh_config: str, warm_runs: int) -> dict[str, Any]:
    with Cluster(f"{host}:0") as cluster:
        started = time.perf_counter()
        if via == "ssh":
            cluster.start_agents(via="ssh", hosts=["node1", "node2"], ssh_config=ssh_config, nproc_per_node=1)
        else:
            cluster.start_agents(via="ray", nodes=2, cpus_per_node=1, strategy="STRICT_SPREAD", nproc_per_node=1)
        cluster.wait(nodes=2, timeout=600)
        ready = time.perf_counter() - started
        started = time.perf_counter()
        assert notebook_launcher(gloo_all_reduce, cluster=cluster, output=CollectingSink()) == [2.0, 2.0]
        first = time.perf_counter() - started
        warm = []
        for _ in range(warm_runs):
            time.sleep(0.5)  # a notebook's pace: the agents' clean-up after a launch is not measured
            started = time.perf_counter()
            notebook_launcher(gloo_all_reduce, cluster=cluster, output=CollectingSink())
            warm.append(time.perf_counter() - started)
        started = time.perf_counter()
    closed = time.perf_counter() - started
    return {"ready": ready, "first": first, "warm": statistics.median(warm), "close": closed}


def main() -> None:
    address, host, ssh_config, rounds, warm_runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    ray.init(address=address, log_to_driver=False)
    samples: dict[str, dict[str, list[float]]] = {"ssh": {}, "ray": {}}
    for _ in range(rounds):
        for via in ("ssh", "ray"):
            for name, value in one_round(via, host, ssh_config, warm_runs).items():
                samples[via].setdefault(name, []).append(value)
    ray.shutdown()
    print("SAMPLES " + json.dumps(samples), flush=True)


if __name__ == "__main__":
    main()
