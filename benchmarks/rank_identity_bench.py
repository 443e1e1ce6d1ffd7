"""What a rank pays to look like a torchrun rank and a multiprocessing child, inside a real kernel.

In a fresh ipykernel (torch and a fork Queue made, as in a notebook), forks a child that runs
``exit_hooks.start`` + ``process_identity.become_rank`` + ``exit_hooks.finish`` and times them,
beside a child that times nothing (the floor: two perf_counter calls). Once as is, once after
``import lightning`` (thousands more modules; Lightning's flag to correct). Prints medians.

    python benchmarks/rank_identity_bench.py [--runs 41]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import running_kernel

KERNEL_CODE = r"""
import json, multiprocessing, os, statistics, sys, time
import torch
from nbaccel.rank import exit_hooks, process_identity

queue = multiprocessing.get_context("fork").Queue()

def child_time(measure):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        started = time.perf_counter()
        if measure:
            exit_hooks.start(os.getppid()); process_identity.become_rank(); exit_hooks.finish(0)
        os.write(write, repr(time.perf_counter() - started).encode())
        os._exit(0)
    os.close(write)
    took = float(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    return took

child_time(True)
floor = statistics.median(child_time(False) for _ in range(__RUNS__))
steps = statistics.median(child_time(True) for _ in range(__RUNS__))
print(json.dumps({"modules": len(sys.modules), "floor_us": round(floor * 1e6, 1), "steps_us": round(steps * 1e6, 1)}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=41)
    runs = parser.parse_args().runs
    code = KERNEL_CODE.replace("__RUNS__", str(runs))
    with running_kernel() as kernel:
        for label, setup in (("kernel with torch", ""), ("after import lightning", "import lightning\n")):
            run = kernel.execute(setup + code, timeout=300)
            if run.status != "ok":
                raise SystemExit(f"{label}: {run.error}")
            print(f"{label}: {run.stdout.strip()}")
    with open("/proc/loadavg") as load:
        print("load:", load.read().strip())


if __name__ == "__main__":
    main()
