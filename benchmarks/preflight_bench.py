"""What the checks before a fork cost: ``fork_hazards()`` and its parts, beside a floor.

Run in a fresh interpreter (the kernel's part), in the states a notebook goes through: torch
imported, then after a multi-threaded CPU op (libgomp's pool started). The floor is one
``os.stat`` of ``/proc/self``, measured in the same run; medians of ``--runs`` batches.

    python benchmarks/preflight_bench.py [--runs 30] [--batch 200]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))


def per_call_us(function: Callable[[], object], runs: int, batch: int) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(batch):
            function()
        samples.append((time.perf_counter() - started) / batch * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--batch", type=int, default=200)
    args = parser.parse_args()

    import torch

    from nbaccel.devices import driver, nvml
    from nbaccel.launch.openmp import openmp_pool_started
    from nbaccel.launch.preflight import fork_hazards

    def measure(label: str, function: Callable[[], object]) -> None:
        floor = per_call_us(lambda: os.stat("/proc/self"), args.runs, args.batch)
        cost = per_call_us(function, args.runs, args.batch)
        print(f"{label:<48} {cost:8.1f} us   floor {floor:5.1f} us   ratio {cost / floor:6.1f}")

    measure("driver probe (cuda_initialised)", driver.cuda_initialised)
    measure("nvml.visible_count", nvml.visible_count)
    measure("openmp_pool_started, pool not started", openmp_pool_started)
    measure("fork_hazards, torch imported", fork_hazards)
    torch.ones(2**22).sum()
    time.sleep(0.05)  # let libgomp's workers go from spinning to sleeping
    measure("openmp_pool_started, pool started", openmp_pool_started)
    measure("fork_hazards, pool started", fork_hazards)
    with open("/proc/loadavg") as load:
        print(f"load average: {load.read().strip()}")


if __name__ == "__main__":
    main()
