"""The notebook's side of ``multinode_bench.py --real``: run on the fabric's login address (10.232.0.1).

argv: MODE (ssh | slurm-alloc | slurm-submit) SSH_CONFIG RUNS SCRIPT. For each of RUNS clusters:
start_agents -> ready, the first launch (gloo init + all_reduce), warm launches of the same, close;
then (MODE slurm-alloc only) ``srun torchrun`` of SCRIPT on the same 2 nodes x 2 ranks, RUNS times.
Prints one JSON line of samples (seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nbaccel import notebook_launcher
from nbaccel.cluster.cluster import Cluster
from nbaccel.testing import CollectingSink

HOST, FIRST_NODE = "10.232.0.1", "10.232.0.11"


def gloo_all_reduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    dist.destroy_process_group()
    return total.item()


def one_cluster(mode: str, ssh_config: str, samples: dict[str, list[float]]) -> None:
    with Cluster(f"{HOST}:0") as cluster:
        started = time.perf_counter()
        if mode == "ssh":
            cluster.start_agents(via="ssh", hosts=["node1", "node2"], ssh_config=ssh_config, nproc_per_node=2)
        elif mode == "slurm-alloc":
            cluster.start_agents(via="slurm", nproc_per_node=2)
        else:
            cluster.start_agents(via="slurm", nodes=2, nproc_per_node=2, time="00:10:00")
        cluster.wait(nodes=2, timeout=120)
        samples["ready"].append(time.perf_counter() - started)
        started = time.perf_counter()
        notebook_launcher(gloo_all_reduce, cluster=cluster, output=CollectingSink())
        samples["first"].append(time.perf_counter() - started)
        for _ in range(5):
            started = time.perf_counter()
            notebook_launcher(gloo_all_reduce, cluster=cluster, output=CollectingSink())
            samples["warm"].append(time.perf_counter() - started)
        started = time.perf_counter()
    samples["close"].append(time.perf_counter() - started)


def srun_torchrun(script: str, port: int) -> None:
    torchrun = f"exec {sys.executable} -m torch.distributed.run --nnodes 2 --nproc-per-node 2 --node-rank $SLURM_NODEID --rdzv-backend static --master-addr {FIRST_NODE} --master-port {port} {script} all_reduce"
    done = subprocess.run(["srun", "--overlap", "--nodes=2", "--ntasks-per-node=1", "sh", "-c", torchrun], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"srun torchrun failed ({done.returncode}): {done.stderr[-2000:]}")


def main() -> None:
    mode, ssh_config, runs, script = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    samples: dict[str, list[float]] = {"ready": [], "first": [], "warm": [], "close": [], "srun_torchrun": []}
    for _ in range(runs):
        one_cluster(mode, ssh_config, samples)
    if mode == "slurm-alloc":
        for index in range(runs):
            started = time.perf_counter()
            srun_torchrun(script, 29500 + index)
            samples["srun_torchrun"].append(time.perf_counter() - started)
    print("SAMPLES " + json.dumps(samples), flush=True)


if __name__ == "__main__":
    main()
