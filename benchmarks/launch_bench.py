"""Launch latency, output throughput and memory of notebook_launcher, measured inside a real kernel.

Everything runs in one fresh ipykernel (the real case: its threads and zmq sockets are there),
beside a raw ``os.fork`` floor and the anchors measured in the same run:
torch.multiprocessing's fork (gloo init + all_reduce) and, when installed, Accelerate's
notebook_launcher. Prints medians and ratios.

    python benchmarks/launch_bench.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import running_kernel  # noqa: E402

KERNEL_CODE = r'''
import json, os, socket, statistics, time
import psutil, torch, torch.distributed as dist
import nbaccel
from nbaccel.output.sinks import CollectingSink

RUNS = __RUNS__

def median_ms(fn, runs=RUNS):
    fn()  # warm-up
    samples = []
    for _ in range(runs):
        t = time.perf_counter(); fn(); samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3

def raw_fork(n):
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        os.waitpid(pid, 0)

def trivial():
    return 0

def gloo_all_reduce():
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    return t.item()

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def mp_worker(i, n, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=i, world_size=n)
    t = torch.ones(1); dist.all_reduce(t); dist.destroy_process_group()

def mp_fork_all_reduce(n):
    import torch.multiprocessing as mp
    mp.start_processes(mp_worker, args=(n, free_port()), nprocs=n, start_method="fork")

quiet = lambda: CollectingSink()
out = {"trivial": {}, "fork_floor": {}, "all_reduce": {}, "mp_all_reduce": {}, "accelerate": {}}
for n in (1, 2, 4, 8):
    runs = RUNS if n < 8 else max(5, RUNS // 2)
    out["fork_floor"][n] = median_ms(lambda: raw_fork(n), runs)
    out["trivial"][n] = median_ms(lambda: nbaccel.notebook_launcher(trivial, num_processes=n, output=quiet()), runs)
    out["all_reduce"][n] = median_ms(lambda: nbaccel.notebook_launcher(gloo_all_reduce, num_processes=n, output=quiet()), runs)
    if n > 1:
        out["mp_all_reduce"][n] = median_ms(lambda: mp_fork_all_reduce(n), max(5, runs // 2))
try:
    import accelerate, contextlib, io
    for n in (2, 4):
        def acc():
            with contextlib.redirect_stdout(io.StringIO()):
                accelerate.notebook_launcher(trivial, num_processes=n, use_port=str(free_port()))
        out["accelerate"][n] = median_ms(acc, max(5, RUNS // 2))
except ImportError:
    pass

def chatty(lines):
    import sys
    write = sys.stdout.write
    for i in range(lines):
        write(f"line {i} of a chatty rank\n")
    return lines

LINES = 50_000
t = time.perf_counter()
sink = CollectingSink()
nbaccel.notebook_launcher(chatty, args=(LINES,), num_processes=4, output=sink)
relay_s = time.perf_counter() - t
out["relay_lines_per_s"] = 4 * LINES / relay_s
out["relay_lost"] = 4 * LINES - sum(len(sink.text(r)) for r in range(4))

def uss_of_rank():
    return psutil.Process().memory_full_info().uss
def uss_raw_fork():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(psutil.Process().memory_full_info().uss).encode()); os._exit(0)
    os.close(w); value = int(os.read(r, 64)); os.close(r); os.waitpid(pid, 0); return value
out["uss_rank_mb"] = statistics.median(nbaccel.notebook_launcher(uss_of_rank, num_processes=2, output=quiet())) / 2**20
out["uss_fork_mb"] = statistics.median(uss_raw_fork() for _ in range(3)) / 2**20
print("BENCH" + json.dumps(out))
'''

TEXT_CELL = "t = time.perf_counter(); nbaccel.notebook_launcher(chatty, args=(LINES,), num_processes=4, output='text'); print('ELAPSED', time.perf_counter() - t)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        run = kernel.execute(KERNEL_CODE.replace("__RUNS__", str(args.runs)), timeout=900)
        if run.status != "ok":
            sys.exit(f"benchmark failed in the kernel:\n{run.error}")
        line = next(l for l in run.stdout.splitlines() if l.startswith("BENCH"))
        results = json.loads(line[len("BENCH"):])
        text = kernel.execute(TEXT_CELL, timeout=300)
        received = sum(1 for l in text.stdout.splitlines() if l.startswith("[rank ") and " line " in l)
        elapsed = float(next(l for l in text.stdout.splitlines() if l.startswith("ELAPSED")).split()[1])
    report(results, received, elapsed)


def report(r: dict, text_received: int, text_elapsed: float) -> None:
    print(f"{'ranks':>5} | {'raw fork':>9} | {'nbaccel trivial':>15} | {'ratio':>5} | {'accelerate':>10} | {'nbaccel/acc':>11} | {'nbaccel gloo+all_reduce':>23} | {'torch.mp fork':>13} | {'ratio':>5}")
    for n in ("1", "2", "4", "8"):
        floor, triv, ar = r["fork_floor"][n], r["trivial"][n], r["all_reduce"][n]
        acc = r["accelerate"].get(n)
        mp = r["mp_all_reduce"].get(n)
        print(
            f"{n:>5} | {floor:7.1f}ms | {triv:13.1f}ms | {triv / floor:5.2f} | "
            + (f"{acc:8.1f}ms | {triv / acc:11.2f}" if acc else f"{'-':>10} | {'-':>11}")
            + f" | {ar:21.1f}ms | "
            + (f"{mp:11.1f}ms | {ar / mp:5.2f}" if mp else f"{'-':>13} | {'-':>5}")
        )
    print(f"relay throughput, 4 ranks x 50,000 lines, kernel-side sink: {r['relay_lines_per_s']:,.0f} lines/s, lost {r['relay_lost']}")
    print(f"relay throughput, text sink into the notebook (client side count): {4 * 50_000 / text_elapsed:,.0f} lines/s, received {text_received:,} of {4 * 50_000:,}")
    print(f"memory per rank (USS): nbaccel rank {r['uss_rank_mb']:.1f} MiB vs raw fork child {r['uss_fork_mb']:.1f} MiB (extra {r['uss_rank_mb'] - r['uss_fork_mb']:.1f} MiB)")


if __name__ == "__main__":
    main()
