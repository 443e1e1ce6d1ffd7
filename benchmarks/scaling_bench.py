"""How the kernel's cost grows with nodes: 2, 4, 8, 16 loopback agents of one rank each.

For each node count, agents already joined (the notebook's case), medians over ``--runs``:
  - a warm trivial launch (``notebook_launcher(lambda: 0, cluster=...)``): wall time, and the
    kernel's own CPU time (this process, every thread: the cluster's thread included);
  - a trivial pool cell (``pool.run(lambda: 0)`` on persistent workers): the same two;
  - the kernel's CPU per node per launch (the figure that must stay flat for 64 and 256 nodes);
  - beside it, torchrun's static rendezvous with N nodes x 1 rank running a trivial script (each
    run a fresh start: what a launch costs without agents), where the machine can run it
    (``--torchrun-max``, default 4: 16 torchruns each import torch again).
Prints the load average beside the figures: the machine is shared.

    python benchmarks/scaling_bench.py [--nodes 2 4 8 16] [--runs 7] [--torchrun-max 4]
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
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from nbaccel import notebook_launcher, start_workers
from nbaccel.cluster.cluster import Cluster
from nbaccel.testing import CollectingSink


def trivial() -> int:
    return 0


def measure(call: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall seconds and median kernel CPU seconds of ``call``, after one warm-up."""
    call()
    walls, cpus = [], []
    for _ in range(runs):
        cpu, wall = time.process_time(), time.perf_counter()
        call()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def torchrun_static(script: str, nodes: int) -> None:
    port = free_port()
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    common = ["--nnodes", str(nodes), "--nproc-per-node", "1", "--rdzv-backend", "static", "--master-addr", "127.0.0.1", "--master-port", str(port)]
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", *common, "--node-rank", str(rank), script],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for rank in range(nodes)
    ]
    codes = [run.wait(300) for run in runs]
    if any(codes):
        raise RuntimeError(f"torchrun exited with {codes}")


def on_nodes(count: int, runs: int) -> dict[str, float]:
    with Cluster("127.0.0.1:0") as cluster:
        argv = [sys.executable, "-m", "nbaccel.agent", cluster.address, "--token-file", cluster.token_file, "--nproc-per-node", "1"]
        agents = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(count)]
        try:
            cluster.wait(nodes=count, timeout=600)
            launch = measure(lambda: notebook_launcher(trivial, cluster=cluster, output=CollectingSink()), runs)
            pool = start_workers(cluster=cluster)
            try:
                cell = measure(lambda: pool.run(trivial, output=CollectingSink()), runs)
            finally:
                pool.stop()
        finally:
            cluster.close()
            for agent in agents:
                agent.wait(30)
    return {"launch_wall": launch[0], "launch_cpu": launch[1], "cell_wall": cell[0], "cell_cpu": cell[1]}


def load_average() -> list[str]:
    with open("/proc/loadavg") as handle:
        return handle.read().split()[:3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--torchrun-max", type=int, default=4)
    parser.add_argument("--torchrun-runs", type=int, default=3)
    arguments = parser.parse_args()
    print(f"load average before: {load_average()}; {os.cpu_count()} CPUs")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as handle:
        handle.write("pass\n")
    floor = measure(lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), arguments.runs)[0]  # one bare Python start
    header = f"{'nodes x 1 rank':>14s} {'launch wall':>12s} {'kernel CPU':>11s} {'CPU/node':>9s} {'cell wall':>10s} {'kernel CPU':>11s} {'CPU/node':>9s} {'torchrun':>9s} {'launch/torchrun':>16s}"
    print(header)
    try:
        for count in arguments.nodes:
            try:
                figures = on_nodes(count, arguments.runs)
            except Exception as error:  # under heavy load a launch can miss heartbeats: say so, go on
                print(f"{count:>14d} failed (load {load_average()[0]}): {str(error).splitlines()[0][:200]}", flush=True)
                continue
            theirs = None
            if count <= arguments.torchrun_max:
                theirs = statistics.median([_timed(lambda n=count: torchrun_static(handle.name, n)) for _ in range(arguments.torchrun_runs)])
            print(
                f"{count:>14d} {figures['launch_wall'] * 1e3:>9.0f} ms {figures['launch_cpu'] * 1e3:>8.0f} ms {figures['launch_cpu'] / count * 1e3:>6.1f} ms"
                f" {figures['cell_wall'] * 1e3:>7.0f} ms {figures['cell_cpu'] * 1e3:>8.0f} ms {figures['cell_cpu'] / count * 1e3:>6.1f} ms"
                + (f" {theirs:>7.2f} s {figures['launch_wall'] / theirs:>15.3f}x" if theirs else f" {'(not run)':>9s}"),
                flush=True,
            )
    finally:
        os.unlink(handle.name)
    print(f"floor: a bare `python -c pass` {floor * 1e3:.0f} ms; load average after: {load_average()}")


def _timed(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


if __name__ == "__main__":
    main()
