"""Warm launches on 2 nodes x 2 ranks (two agents on loopback) beside torchrun's static rendezvous.

Measured in one run, medians:
  - nbaccel: a trivial function, agents already running (the notebook's case: agents stay up);
  - nbaccel: gloo init_process_group + all_reduce across the nodes;
  - torchrun --nnodes 2 --nproc-per-node 2 (static rendezvous, node ranks 0 and 1, both started
    at once) running the same function as a script: what a user without agents pays per launch;
  - the same torchrun script with gloo init + all_reduce.
Prints medians and ratios (nbaccel / torchrun). Targets: warm 2x2 under 0.5 s, at most 0.5x torchrun.

    python benchmarks/multinode_bench.py [--runs 15] [--torchrun-runs 5]
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nbaccel import notebook_launcher
from nbaccel.agent.cluster import Cluster
from nbaccel.testing import CollectingSink

SCRIPT = """
import os, sys
if sys.argv[1] == "all_reduce":
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    dist.destroy_process_group()
"""


def trivial() -> int:
    return 0


def gloo_all_reduce() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    return total.item()


def median_s(call, runs: int) -> float:
    call()  # warm-up
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun_2x2(script: str, mode: str) -> None:
    port = free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", "--node-rank", str(rank),
             "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port), script, mode],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for rank in (0, 1)
    ]
    codes = [node.wait(120) for node in nodes]
    if codes != [0, 0]:
        raise RuntimeError(f"torchrun exited with {codes}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--torchrun-runs", type=int, default=5)
    arguments = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write(SCRIPT)
    try:
        with Cluster("127.0.0.1:0") as cluster:
            argv = [sys.executable, "-m", "nbaccel.agent", cluster.address, "--token-file", cluster.token_file, "--nproc-per-node", "2"]
            agents = [subprocess.Popen(argv) for _ in range(2)]
            try:
                cluster.wait(nodes=2, timeout=120)
                ours = median_s(lambda: notebook_launcher(trivial, cluster=cluster, output=CollectingSink()), arguments.runs)
                ours_gloo = median_s(lambda: notebook_launcher(gloo_all_reduce, cluster=cluster, output=CollectingSink()), arguments.runs)
            finally:
                cluster.close()
                for agent in agents:
                    agent.wait(15)
        theirs = median_s(lambda: torchrun_2x2(handle.name, "trivial"), arguments.torchrun_runs)
        theirs_gloo = median_s(lambda: torchrun_2x2(handle.name, "all_reduce"), arguments.torchrun_runs)
    finally:
        os.unlink(handle.name)
    print(f"{'2 nodes x 2 ranks (loopback)':44s} {'median':>10s} {'vs torchrun':>12s}")
    print(f"{'nbaccel warm launch, trivial fn':44s} {ours * 1e3:8.0f} ms {ours / theirs:11.2f}x")
    print(f"{'torchrun static, trivial script':44s} {theirs * 1e3:8.0f} ms {1.0:11.2f}x")
    print(f"{'nbaccel warm, gloo init + all_reduce':44s} {ours_gloo * 1e3:8.0f} ms {ours_gloo / theirs_gloo:11.2f}x")
    print(f"{'torchrun static, gloo init + all_reduce':44s} {theirs_gloo * 1e3:8.0f} ms {1.0:11.2f}x")
    print(f"target: warm 2x2 < 500 ms -> {'met' if ours < 0.5 else 'MISSED'}; <= 0.5x torchrun -> {'met' if ours <= 0.5 * theirs else 'MISSED'}")


if __name__ == "__main__":
    main()
