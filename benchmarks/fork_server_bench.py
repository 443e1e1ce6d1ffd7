"""The fork server and zero-copy transfers, measured inside a real kernel beside their floors.

1. A 2-rank gloo init + all_reduce launch: forked from a fork-safe kernel (the floor), through the
   fork server from the same kernel marked not fork-safe (nbaccel.testing.mark_not_fork_safe),
   and spawned; interleaved, medians, ratios. Also the server's own memory (USS) and idle CPU.
2. 1 GiB: ``pool.push`` of a tensor to 2 workers and a 1 GiB result from one rank, against one
   ``torch.clone`` of 1 GiB in the kernel (the memcpy floor); the kernel's peak RSS during each
   (VmHWM, reset before each run through /proc/self/clear_refs) over the payload. The result's
   row includes the rank making the tensor (on this VM that alone is about a clone: every page
   faulted in); the same launch making it and returning nothing is timed too, and the difference
   is what the transfer itself costs.

    python benchmarks/fork_server_bench.py [--runs 9] [--gib 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import running_kernel

KERNEL_CODE = r"""
%load_ext nbaccel
import gc, json, os, statistics, time
import psutil, torch, torch.distributed as dist
import nbaccel
from nbaccel.launch.starters import fork_server
from nbaccel.output.sinks import CollectingSink
from nbaccel.testing import mark_fork_safe, mark_not_fork_safe

RUNS, GIB = __RUNS__, __GIB__
quiet = lambda: CollectingSink()

def gloo_all_reduce():
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    return t.item()

def timed(fn):
    t = time.perf_counter(); fn(); return (time.perf_counter() - t) * 1e3

def fork_launch():
    mark_fork_safe(); nbaccel.notebook_launcher(gloo_all_reduce, num_processes=2, output=quiet())

def server_launch():
    mark_not_fork_safe("pretend CUDA"); nbaccel.notebook_launcher(gloo_all_reduce, num_processes=2, output=quiet()); mark_fork_safe()

def spawn_launch():
    nbaccel.notebook_launcher(gloo_all_reduce, num_processes=2, output=quiet(), start_method="spawn")

out = {"fork": [], "server": [], "spawn": []}
os.environ["NBACCEL_QUIET"] = "1"
fork_launch(); server_launch()  # warm-up: gloo in the kernel's page cache, the server's first rank
for _ in range(RUNS):
    out["fork"].append(timed(fork_launch)); out["server"].append(timed(server_launch))
for _ in range(max(2, RUNS // 4)):
    out["spawn"].append(timed(spawn_launch))
server = psutil.Process(fork_server.running_server().pid)
out["server_how"] = fork_server.running_server().how
out["server_uss_mb"] = server.memory_full_info().uss / 2**20
before = server.cpu_times(); time.sleep(2.0); after = server.cpu_times()
out["server_idle_cpu_s"] = after.user + after.system - before.user - before.system

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

def peak_rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

NBYTES = int(GIB * 2**30)
payload = torch.ones(NBYTES // 4)
def clone_floor():
    copy = payload.clone(); del copy
def result_rank():
    return torch.ones(NBYTES // 4) if os.environ["RANK"] == "0" else None
def made_not_returned():  # the same launch and tensor, nothing sent back: what the transfer adds is the difference
    made = torch.ones(NBYTES // 4) if os.environ["RANK"] == "0" else None
    return None if made is None else made.numel()

pool = nbaccel.start_workers(2)
zc = {"clone": [], "push": [], "result": [], "made_only": [], "push_peak": [], "result_peak": [], "clone_peak": []}
for _ in range(max(3, RUNS // 3)):
    gc.collect(); reset_peak(); base = psutil.Process().memory_info().rss
    zc["clone"].append(timed(clone_floor)); zc["clone_peak"].append((peak_rss() - base) / NBYTES)
    gc.collect(); reset_peak(); base = psutil.Process().memory_info().rss
    zc["push"].append(timed(lambda: pool.push(big=payload))); zc["push_peak"].append((peak_rss() - base) / NBYTES)
    pool.run_task(lambda ns: ns.pop("big", None) is None)
    gc.collect(); reset_peak(); base = psutil.Process().memory_info().rss
    holder = []
    zc["result"].append(timed(lambda: holder.append(nbaccel.notebook_launcher(result_rank, num_processes=2, output=quiet()))))
    zc["result_peak"].append((peak_rss() - base) / NBYTES)
    assert holder[0][0].numel() == NBYTES // 4
    del holder
    zc["made_only"].append(timed(lambda: nbaccel.notebook_launcher(made_not_returned, num_processes=2, output=quiet())))
pool.stop()
out["zero_copy"] = zc
print("BENCH" + json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--gib", type=float, default=1.0, help="the payload of the zero-copy part, in GiB")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    with running_kernel(env={"NBACCEL_OUTPUT": "text", "NBACCEL_FORK_SERVER": "eager"}) as kernel:
        run = kernel.execute(KERNEL_CODE.replace("__RUNS__", str(args.runs)).replace("__GIB__", repr(args.gib)), timeout=1800)
        if run.status != "ok":
            sys.exit(f"benchmark failed in the kernel:\n{run.error}\n{run.stdout[-2000:]}")
        line = next((text for text in run.stdout.splitlines() if text.startswith("BENCH")), None)
        if line is None:
            sys.exit(f"no figures from the kernel:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    report(json.loads(line[len("BENCH") :]), load, args.gib)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def report(r: dict, load: list[str], gib: float) -> None:
    fork, server, spawn = median(r["fork"]), median(r["server"]), median(r["spawn"])
    print(f"load average at start: {' '.join(load)} (2 shared cores)")
    print("2-rank gloo init + all_reduce launch (median ms, ratio to fork)")
    print(f"  forked from a fork-safe kernel : {fork:8.1f} ms  1.00x  (n={len(r['fork'])}, range {min(r['fork']):.0f}-{max(r['fork']):.0f})")
    print(
        f"  fork server, kernel not safe   : {server:8.1f} ms  {server / fork:4.2f}x  (n={len(r['server'])}, range {min(r['server']):.0f}-{max(r['server']):.0f})"
    )
    print(f"  spawn                          : {spawn:8.1f} ms  {spawn / fork:4.1f}x  (n={len(r['spawn'])})")
    print(f"  server ({r['server_how']}): USS {r['server_uss_mb']:.1f} MiB, CPU while idle for 2 s: {r['server_idle_cpu_s'] * 1e3:.0f} ms")
    zc = r["zero_copy"]
    clone = median(zc["clone"])
    print(f"{gib:g} GiB (median ms, ratio to one torch.clone in the kernel; kernel peak RSS over the payload)")
    print(f"  torch.clone (floor)            : {clone:8.1f} ms  1.00x  peak {median(zc['clone_peak']):.2f}x")
    print(f"  pool.push to 2 workers         : {median(zc['push']):8.1f} ms  {median(zc['push']) / clone:4.2f}x  peak {median(zc['push_peak']):.2f}x")
    print(f"  result from a rank (2 ranks)   : {median(zc['result']):8.1f} ms  {median(zc['result']) / clone:4.2f}x  peak {median(zc['result_peak']):.2f}x")
    made = median(zc["made_only"])
    moved = median(zc["result"]) - made
    print(f"    of which the launch and making the tensor in the rank (nothing returned): {made:8.1f} ms")
    print(f"    so the transfer itself       : {moved:8.1f} ms  {moved / clone:4.2f}x")


if __name__ == "__main__":
    main()
