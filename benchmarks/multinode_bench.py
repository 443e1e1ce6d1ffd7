"""Warm launches on 2 nodes x 2 ranks (two agents on loopback) beside torchrun's static rendezvous.

Measured in one run, medians:
  - nbaccel: a trivial function, agents already running (the notebook's case: agents stay up);
  - nbaccel: gloo init_process_group + all_reduce across the nodes;
  - torchrun --nnodes 2 --nproc-per-node 2 (static rendezvous, node ranks 0 and 1, both started
    at once) running the same function as a script: what a user without agents pays per launch;
  - the same torchrun script with gloo init + all_reduce.
Prints medians and ratios (nbaccel / torchrun). Targets: warm 2x2 under 0.5 s, at most 0.5x torchrun.

With ``--real`` (root, scripts/install-cluster-deps.sh) it measures instead, on a real sshd and
Slurm with the nodes in network namespaces (scripts/cluster_fabric.py), side by side in one run:
``start_agents`` to ready through ssh, Slurm inside an allocation and Slurm by submission; the
first and the warm launch (gloo init + all_reduce, 2 nodes x 2 ranks) on each; and ``srun
torchrun`` of the same 2-node script in the same allocation.

    python benchmarks/multinode_bench.py [--runs 15] [--torchrun-runs 5]
    python benchmarks/multinode_bench.py --real [--runs 5]
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
from nbaccel.cluster.cluster import Cluster
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
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--node-rank",
                str(rank),
                "--rdzv-backend",
                "static",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                script,
                mode,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rank in (0, 1)
    ]
    codes = [node.wait(120) for node in nodes]
    if codes != [0, 0]:
        raise RuntimeError(f"torchrun exited with {codes}")


def real_clusters(runs: int) -> None:
    """Each way of starting agents, and srun torchrun, on one fabric (see the module's docstring)."""
    import importlib.util
    import json

    here = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location("cluster_fabric", os.path.join(here, "..", "scripts", "cluster_fabric.py"))
    assert spec is not None and spec.loader is not None
    fabric_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fabric_module)
    reason = fabric_module.unavailable()
    if reason:
        raise SystemExit(f"multinode_bench --real: {reason}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False, dir="/run") as handle:
        handle.write(SCRIPT)
    results: dict[str, dict[str, list[float]]] = {}
    try:
        with fabric_module.Fabric(nodes=2) as fabric:
            print(f"fabric up: {fabric.timings}")
            for mode in ("ssh", "slurm-alloc", "slurm-submit"):
                argv = [sys.executable, os.path.join(here, "cluster_start_kernel.py"), mode, fabric.ssh_config, str(runs), handle.name]
                if mode == "slurm-alloc":
                    argv = ["salloc", "--nodes=2", "--ntasks-per-node=1", *argv]
                done = subprocess.run(fabric.in_ctl(argv), capture_output=True, text=True, env=fabric.env(), timeout=1800)
                line = next((x for x in done.stdout.splitlines() if x.startswith("SAMPLES ")), None)
                if line is None:
                    raise RuntimeError(f"{mode} failed ({done.returncode}): {done.stderr[-3000:]}")
                results[mode] = json.loads(line.removeprefix("SAMPLES "))
    finally:
        os.unlink(handle.name)
    torchrun = statistics.median(results["slurm-alloc"]["srun_torchrun"])
    print(f"{'2 nodes x 2 ranks, real sshd / Slurm 22.05':44s} {'ready':>8s} {'first':>8s} {'warm':>8s} {'warm/torchrun':>14s}")
    for mode, samples in results.items():
        ready, first, warm = (statistics.median(samples[k]) for k in ("ready", "first", "warm"))
        print(f"{'nbaccel via ' + mode:44s} {ready:7.2f}s {first:7.2f}s {warm:7.3f}s {warm / torchrun:13.2f}x")
    print(f"{'srun torchrun (static), same script':44s} {'':8s} {'':8s} {torchrun:7.3f}s {1.0:13.2f}x   (each run = a fresh start)")
    print("samples (s): " + json.dumps({m: {k: [round(v, 3) for v in vs] for k, vs in s.items() if vs} for m, s in results.items()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--torchrun-runs", type=int, default=5)
    parser.add_argument("--real", action="store_true", help="real sshd and Slurm in network namespaces (root)")
    arguments = parser.parse_args()
    if arguments.real:
        import signal

        signal.signal(signal.SIGTERM, signal.default_int_handler)  # a SIGTERM still removes the fabric
        real_clusters(arguments.runs)
        return
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
