"""Agents ready through Ray against through ssh, on the same two "machines" (network namespaces
with real sshd and a real two-node Ray cluster, scripts/cluster_fabric.py and
tests/agent/ray_fabric.py), and the first and warm launches across them (gloo init + all_reduce,
2 nodes x 1 rank), medians over ``--rounds`` fresh clusters. The kernel runs on the Ray head's
namespace (where JupyterLab runs on a KubeRay head), for both ways. Root only.

    python benchmarks/ray_start_bench.py [--rounds 3] [--warm-runs 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.agent.ray_fabric import RayOnFabric  # noqa: E402 - after the path


def load_average() -> list[str]:
    with open("/proc/loadavg") as handle:
        return handle.read().split()[:3]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm-runs", type=int, default=5)
    arguments = parser.parse_args()
    spec = importlib.util.spec_from_file_location("cluster_fabric", ROOT / "scripts" / "cluster_fabric.py")
    assert spec is not None and spec.loader is not None
    fabric_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fabric_module)
    reason = fabric_module.unavailable(slurm=False, ssh=True)
    if reason:
        raise SystemExit(f"ray_start_bench: {reason}")
    print(f"load average before: {load_average()}; {os.cpu_count()} CPUs", flush=True)
    with fabric_module.Fabric(nodes=2, slurm=False, ssh=True) as fabric:
        ray_nodes = RayOnFabric(fabric)
        try:
            kernel = [sys.executable, str(ROOT / "benchmarks" / "ray_start_kernel.py"), ray_nodes.address, fabric.addresses[0], fabric.ssh_config]
            argv = fabric.on_node(0, [*kernel, str(arguments.rounds), str(arguments.warm_runs)])
            done = subprocess.run(argv, capture_output=True, text=True, env=ray_nodes.env, timeout=1800)
        finally:
            ray_nodes.close()
    line = next((x for x in done.stdout.splitlines() if x.startswith("SAMPLES ")), None)
    if line is None:
        raise SystemExit(f"the kernel failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr[-3000:]}")
    samples = json.loads(line.removeprefix("SAMPLES "))
    print(f"{'2 namespaces x 1 rank, kernel on the head':42s} {'ready':>8s} {'first':>8s} {'warm':>8s} {'close':>8s}")
    for via in ("ssh", "ray"):
        ready, first, warm, close = (statistics.median(samples[via][k]) for k in ("ready", "first", "warm", "close"))
        print(f"{'nbaccel via ' + via:42s} {ready:7.2f}s {first:7.2f}s {warm:7.3f}s {close:7.2f}s")
    ratio = statistics.median(samples["ray"]["ready"]) / statistics.median(samples["ssh"]["ready"])
    print(
        f"ready via ray / via ssh: {ratio:.2f}x; samples (s): "
        + json.dumps({v: {k: [round(x, 3) for x in xs] for k, xs in s.items()} for v, s in samples.items()})
    )
    print(f"load average after: {load_average()}")


if __name__ == "__main__":
    main()
