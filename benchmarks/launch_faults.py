"""What each step of a rank's start costs in page faults (copy-on-write) and microseconds.

Runs in one fresh ipykernel (the real case: its heap, threads and zmq sockets are there). In each
forked rank, ``resource.getrusage`` is read around every step of
``nbaccel.rank.bootstrap.run_rank`` before the function (the steps ``launch_phases.RANK_STEPS``
names, plus the environment), and at the top of ``run_rank`` (the faults from the fork itself to
the rank's first line: a forked child's counters start at zero). Medians over many launches,
beside a raw ``os.fork`` child's faults to its ``_exit`` measured in the same kernel.

    python benchmarks/launch_faults.py [--runs 41] [--ranks 2]

A page written after a fork is a minor fault of about 5 us (the copy): the table shows which
steps write the kernel's pages. The wrappers themselves add a few faults (their own frames).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import running_kernel

KERNEL_CODE = r"""
import json, os, resource, statistics, sys, time
sys.path.insert(0, __BENCH_DIR__)
import nbaccel, launch_phases
from nbaccel.output.sinks import CollectingSink

STEPS = launch_phases.RANK_STEPS + [("nbaccel.rank.bootstrap", "_set_environment", "environment")]
MARKS = []

def usage():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_minflt + u.ru_majflt, time.perf_counter_ns()

def counted(original, label):
    def wrapper(*args, **kwargs):
        f0, t0 = usage()
        try:
            return original(*args, **kwargs)
        finally:
            f1, t1 = usage()
            MARKS.append((label, f1 - f0, (t1 - t0) / 1e3))
    return wrapper

saved = []
for path, name, label in STEPS:
    owner = launch_phases._owner(path)
    original = getattr(owner, name, None)
    if original is None:  # an older nbaccel without this step (measured side by side)
        continue
    saved.append((owner, name, original))
    setattr(owner, name, counted(original, label))
fork = launch_phases._owner("nbaccel.launch.starters.fork")
original_run_rank = fork.run_rank
saved.append((fork, "run_rank", original_run_rank))

def run_rank(*args, **kwargs):
    faults, now = usage()
    MARKS.clear()
    MARKS.append(("fork to run_rank", faults, 0.0))
    MARKS.append(("@start", 0, now / 1e3))
    return original_run_rank(*args, **kwargs)
fork.run_rank = run_rank

def profiled():
    faults, now = usage()
    start = dict((m[0], m[2]) for m in MARKS)["@start"]
    return [m for m in MARKS if m[0] != "@start"] + [("run_rank to function (total)", faults - MARKS[0][1], now / 1e3 - start), ("fork to function (total)", faults, 0.0)]

def raw_fork_faults():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        u = resource.getrusage(resource.RUSAGE_SELF)
        os.write(w, str(u.ru_minflt + u.ru_majflt).encode()); os._exit(0)
    os.close(w); value = int(os.read(r, 64)); os.close(r); os.waitpid(pid, 0); return value

rows = {}
try:
    nbaccel.notebook_launcher(profiled, num_processes=RANKS, output=CollectingSink())  # warm-up
    for _ in range(RUNS):
        for rank in nbaccel.notebook_launcher(profiled, num_processes=RANKS, output=CollectingSink()):
            for label, faults, us in rank:
                rows.setdefault(label, ([], []))
                rows[label][0].append(faults); rows[label][1].append(us)
finally:
    for owner, name, original in reversed(saved):
        setattr(owner, name, original)
out = {label: (statistics.median(f), statistics.median(u)) for label, (f, u) in rows.items()}
out["raw fork child (fork to _exit)"] = (statistics.median(raw_fork_faults() for _ in range(RUNS)), 0.0)
print("FAULTS" + json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=41)
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    code = f"RUNS = {args.runs}\nRANKS = {args.ranks}\n" + KERNEL_CODE.replace("__BENCH_DIR__", repr(os.path.dirname(os.path.abspath(__file__))))
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        run = kernel.execute(code, timeout=600)
        if run.status != "ok":
            sys.exit(f"benchmark failed in the kernel:\n{run.error}")
        line = next(out for out in run.stdout.splitlines() if out.startswith("FAULTS"))
    report(json.loads(line[len("FAULTS") :]), args.runs, args.ranks)


def report(rows: dict[str, list[float]], runs: int, ranks: int) -> None:
    with open("/proc/loadavg") as f:
        load = f.read().split()[0]
    print(f"a rank's start, step by step (medians of {runs} launches x {ranks} ranks, in a real kernel; load {load}):")
    print(f"{'step':>34} | {'faults':>7} | {'us':>8}")
    for label, (faults, us) in rows.items():
        print(f"{label:>34} | {faults:7.0f} | " + (f"{us:8.0f}" if us else f"{'-':>8}"))


if __name__ == "__main__":
    main()
