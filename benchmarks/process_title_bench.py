"""What a rank pays to say what it is in ps, top and nvidia-smi (``nbaccel.rank.process_title``), in a real kernel.

In a fresh ipykernel (torch imported, as in a notebook), forks children that each time one step
right after the fork, as a rank's bootstrap does it:

- ``floor``: the rank's first step only (``bootstrap._detach_from_kernel``: own pgid,
  PR_SET_PDEATHSIG, default signal handlers), as run_rank starts;
- ``page``: that, then one byte written into a page inherited from the kernel (the
  copy-on-write fault every page a rank writes costs: the anchor);
- ``name_rank``: that, then run_rank's next step (``bootstrap._name_process``): the title's
  words from the job's label (made once per launch, in the kernel), a prctl and a write of the
  argument area.

Prints medians (microseconds) over ``--runs`` forks each, twice (interleaved), and the naming's
cost beside the first step's (a ratio), with the load average.

    python benchmarks/process_title_bench.py [--runs 201]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import running_kernel

KERNEL_CODE = r"""
import json, os, signal, statistics, time
import torch
from nbaccel.launch.debug_desk import debuggable_job
from nbaccel.rank import bootstrap, process_title

inherited = bytearray(os.urandom(64 * 4096))  # written after the fork: one fresh page per child

def train():
    pass

job = debuggable_job(train, (), post_mortem=False)  # as a launch makes it: labelled once, here
env = {"WORLD_SIZE": "4"}

def step(which, parent):
    bootstrap._detach_from_kernel(parent, [])  # a rank's first step, in every case
    if which == "page":
        inherited[4096 * 7] = 1
    elif which == "name_rank":
        bootstrap._name_process(job, 1, env)  # run_rank's second step

def child_time(which):
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        started = time.perf_counter()
        step(which, parent)
        os.write(write, repr(time.perf_counter() - started).encode())
        os._exit(0)
    os.close(write)
    took = float(os.read(read, 64))
    os.close(read)
    os.waitpid(pid, 0)
    return took

figures = {}
for _ in range(2):  # twice, interleaved: the second round says how steady the machine was
    for which in ("floor", "page", "name_rank"):
        child_time(which)
        figures.setdefault(which, []).append(round(statistics.median(child_time(which) for _ in range(__RUNS__)) * 1e6, 1))
area = process_title._AREA
figures["argument_area_bytes"] = area[1] - area[0] if area else None
print(json.dumps(figures))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=201)
    runs = parser.parse_args().runs
    with running_kernel() as kernel:
        run = kernel.execute(KERNEL_CODE.replace("__RUNS__", str(runs)), timeout=300)
        if run.status != "ok":
            raise SystemExit(str(run.error))
    import json

    figures = json.loads(run.stdout.strip().splitlines()[-1])
    print(f"medians over {runs} forks each, two rounds, in a real kernel (us): {figures}")
    for round_ in range(2):
        floor, page, named = (figures[which][round_] for which in ("floor", "page", "name_rank"))
        print(
            f"  round {round_ + 1}: the first step {floor:.1f} us; one page written after it {page - floor:+.1f} us;"
            f" naming the rank after it {named - floor:.1f} us ({(named - floor) / floor:.2f}x the first step)"
        )
    with open("/proc/loadavg") as load:
        print("load:", load.read().strip())


if __name__ == "__main__":
    main()
