"""Launch latency, output throughput and memory of notebook_launcher, measured inside a real kernel.

Everything runs in one fresh ipykernel (the real case: its threads and zmq sockets are there),
beside a raw ``os.fork`` floor and the anchors measured in the same run:
torch.multiprocessing's fork (gloo init + all_reduce) and, when installed, Accelerate's
notebook_launcher. Prints medians and ratios.

    python benchmarks/launch_bench.py [--runs 15] [--ranks 1,2,4,8] [--against DIR [--per-round 2]]

``--against DIR`` (another checkout, e.g. ``git worktree add /tmp/base main``) measures both trees
in the same run: a kernel each, its tree first on PYTHONPATH, interleaved round by round, and
prints each tree's figures, then both side by side with the ratio new/old and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import side_by_side  # beside this script

from tests.kernel_harness import Kernel

SETUP = r"""
import json, os, socket, statistics, sys, time
import psutil, torch, torch.distributed as dist
import nbaccel
from nbaccel.output.sinks import CollectingSink
sys.path.insert(0, __BENCH_DIR__)
import launch_phases

RANKS = __RANKS__  # process counts; on GPUs at most one per GPU

WARM = set()  # figures warmed up already: only a kernel's first round pays their warm-up

def samples_ms(fn, runs, key):
    if key not in WARM:
        fn(); WARM.add(key)
    taken = []
    for _ in range(runs):
        t = time.perf_counter(); fn(); taken.append((time.perf_counter() - t) * 1e3)
    return taken

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

def gloo_all_reduce():  # nccl on GPU ranks: the default backend for a CUDA tensor
    on_gpu = os.environ.get("NBACCEL_DEVICE_TYPE") == "cuda"
    dist.init_process_group("nccl" if on_gpu else "gloo")
    t = torch.ones(1, device=f"cuda:{os.environ['LOCAL_RANK']}" if on_gpu else "cpu"); dist.all_reduce(t)
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

def phase_rows(n, runs):
    # Where the milliseconds go: the same trivial launch with timers around its pieces (launch_phases).
    launch_phases.install()
    try:
        if ("phases", n) not in WARM:
            nbaccel.notebook_launcher(launch_phases.traced_trivial, num_processes=n, output=quiet()); WARM.add(("phases", n))
        rows = []
        for _ in range(runs):
            launch_phases.PHASES.clear()
            t0 = time.perf_counter_ns()
            values = nbaccel.notebook_launcher(launch_phases.traced_trivial, num_processes=n, output=quiet())
            rows.append(launch_phases.breakdown(launch_phases.kernel_phases(), values, t0, time.perf_counter_ns()))
    finally:
        launch_phases.uninstall()
    return rows

def bench_round(runs):
    # Samples (ms) of every timed figure, runs of each (fewer for 8 ranks and the anchors).
    out = {"trivial": {}, "fork_floor": {}, "all_reduce": {}, "mp_all_reduce": {}, "accelerate": {}, "phases": {}}
    for n in RANKS:
        m = runs if n < 8 else max(1, runs // 2)
        out["fork_floor"][n] = samples_ms(lambda: raw_fork(n), m, ("floor", n))
        out["trivial"][n] = samples_ms(lambda: nbaccel.notebook_launcher(trivial, num_processes=n, output=quiet()), m, ("trivial", n))
        out["all_reduce"][n] = samples_ms(lambda: nbaccel.notebook_launcher(gloo_all_reduce, num_processes=n, output=quiet()), m, ("gloo", n))
        if n > 1:
            out["mp_all_reduce"][n] = samples_ms(lambda: mp_fork_all_reduce(n), max(1, m // 2), ("mp", n))
    try:
        import accelerate, contextlib, io
        for n in [n for n in RANKS if n in (2, 4)]:
            def acc():
                with contextlib.redirect_stdout(io.StringIO()):
                    accelerate.notebook_launcher(trivial, num_processes=n, use_port=str(free_port()))
            out["accelerate"][n] = samples_ms(acc, max(1, runs // 2), ("accelerate", n))
    except ImportError:
        pass
    for n in RANKS:
        out["phases"][n] = phase_rows(n, runs if n < 8 else max(1, runs // 2))
    print("BENCH" + json.dumps(out))
"""

ROUND = "bench_round(__RUNS__)"

CLOSING = r"""
def chatty(lines):
    import sys
    write = sys.stdout.write
    for i in range(lines):
        write(f"line {i} of a chatty rank\n")
    return lines

LINES = 50_000
CHATTY = min(4, max(RANKS))
out = {}
t = time.perf_counter()
sink = CollectingSink()
nbaccel.notebook_launcher(chatty, args=(LINES,), num_processes=CHATTY, output=sink)
relay_s = time.perf_counter() - t
out["chatty_ranks"] = CHATTY
out["relay_lines_per_s"] = CHATTY * LINES / relay_s
out["relay_lost"] = CHATTY * LINES - sum(len(sink.text(r)) for r in range(CHATTY))

def uss_of_rank():
    return psutil.Process().memory_full_info().uss
def uss_raw_fork():
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(w, str(psutil.Process().memory_full_info().uss).encode()); os._exit(0)
    os.close(w); value = int(os.read(r, 64)); os.close(r); os.waitpid(pid, 0); return value
out["uss_rank_mb"] = statistics.median(nbaccel.notebook_launcher(uss_of_rank, num_processes=min(2, max(RANKS)), output=quiet())) / 2**20
out["uss_fork_mb"] = statistics.median(uss_raw_fork() for _ in range(3)) / 2**20
print("BENCH" + json.dumps(out))
"""

TEXT_CELL = (
    "t = time.perf_counter(); nbaccel.notebook_launcher(chatty, args=(LINES,), num_processes=CHATTY, output='text'); print('ELAPSED', time.perf_counter() - t)"
)


def rank_counts(text: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2): the process counts to measure."""
    counts = tuple(int(part) for part in text.split(","))
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive counts separated by commas, e.g. 1,2; got {text!r}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--ranks", type=rank_counts, default=(1, 2, 4, 8), metavar="1,2,4,8", help="process counts to measure (on GPUs at most one per GPU)")
    parser.add_argument("--against", type=side_by_side.checkout, metavar="DIR", help="another checkout of nbaccel, measured in the same run, round by round")
    parser.add_argument("--per-round", type=int, default=2, help="with --against: runs of each figure per tree per round")
    args = parser.parse_args()
    checkouts = side_by_side.trees(args.against)
    per_round = args.runs if args.against is None else max(1, args.per_round)
    rounds = -(-args.runs // per_round)
    load_before = side_by_side.load_average()
    with side_by_side.kernels(checkouts, {"NBACCEL_OUTPUT": "text"}) as running:
        setup = SETUP.replace("__BENCH_DIR__", repr(os.path.dirname(os.path.abspath(__file__)))).replace("__RANKS__", repr(args.ranks))
        for kernel in running.values():
            _bench_cell(kernel, setup)
        samples: dict[str, list[dict]] = {label: [] for label in running}
        for index in range(rounds):
            for label in side_by_side.turns(index, list(running)):
                samples[label].append(_bench_cell(running[label], ROUND.replace("__RUNS__", str(per_round))))
        results = {label: {**merged(samples[label]), **_bench_cell(running[label], CLOSING)} for label in running}
        for label, kernel in running.items():
            results[label]["text"] = text_relay(kernel)
    load = f"load average {load_before} before, {side_by_side.load_average()} after"
    for label, r in results.items():
        if len(results) > 1:
            print(f"\n== {label}: {checkouts[label]} ==")
        report(r, *r["text"])
    if len(results) > 1:
        print(f"\nside by side, {rounds} rounds of {per_round} runs per tree, interleaved (medians, ms):")
        side_by_side.compare(comparison(results["new"], results["old"]))
    print(load)


def _bench_cell(kernel: Kernel, code: str) -> dict:
    run = kernel.execute(code, timeout=900)
    if run.status != "ok":
        sys.exit(f"benchmark failed in the kernel:\n{run.error}")
    line = next((out for out in run.stdout.splitlines() if out.startswith("BENCH")), "BENCH{}")
    return dict(json.loads(line[len("BENCH") :]))


def text_relay(kernel: Kernel) -> tuple[int, float]:
    """(lines the client received, seconds) of the chatty launch into a text sink."""
    text = kernel.execute(TEXT_CELL, timeout=300)
    received = sum(1 for out in text.stdout.splitlines() if out.startswith("[rank ") and " line " in out)
    return received, float(next(out for out in text.stdout.splitlines() if out.startswith("ELAPSED")).split()[1])


def merged(rounds: list[dict]) -> dict:
    """Every round's samples, as medians: figure -> ranks -> ms; phases -> ranks -> label -> ms."""
    out: dict = {}
    for figure in ("trivial", "fork_floor", "all_reduce", "mp_all_reduce", "accelerate"):
        pooled: dict[str, list[float]] = {}
        for sample in rounds:
            for n, values in sample[figure].items():
                pooled.setdefault(n, []).extend(values)
        out[figure] = {n: statistics.median(values) for n, values in pooled.items()}
    rows: dict[str, list[dict[str, float]]] = {}
    for sample in rounds:
        for n, taken in sample["phases"].items():
            rows.setdefault(n, []).extend(taken)
    labels = {n: list(dict.fromkeys(label for row in taken for label in row)) for n, taken in rows.items()}
    out["phases"] = {n: {label: statistics.median(row.get(label, 0.0) for row in taken) for label in labels[n]} for n, taken in rows.items()}
    return out


def comparison(new: dict, old: dict) -> list[tuple[str, dict[str, float]]]:
    """The figures both trees have, as (name, {"new": ms, "old": ms}) rows."""
    rows: list[tuple[str, dict[str, float]]] = []
    for n in new["trivial"]:
        floor = {"new": new["fork_floor"][n], "old": old["fork_floor"][n]}
        trivial = {"new": new["trivial"][n], "old": old["trivial"][n]}
        rows.append((f"raw fork floor, {n} ranks", floor))
        rows.append((f"trivial launch, {n} ranks", trivial))
        rows.append((f"  trivial / raw fork, {n} ranks (x)", {k: trivial[k] / floor[k] for k in trivial}))
        rows.append((f"gloo init+all_reduce, {n} ranks", {"new": new["all_reduce"][n], "old": old["all_reduce"][n]}))
        if n in new["mp_all_reduce"] and n in old["mp_all_reduce"]:
            trees = {"new": new, "old": old}
            rows.append((f"  gloo / torch.mp fork, {n} ranks (x)", {k: r["all_reduce"][n] / r["mp_all_reduce"][n] for k, r in trees.items()}))
    for n, phases in new["phases"].items():
        for label, value in phases.items():
            if label in old["phases"].get(n, {}):
                rows.append((f"phase {label}, {n} ranks", {"new": value, "old": old["phases"][n][label]}))
    rows.append(("USS of a rank over a raw fork child (MiB)", {k: r["uss_rank_mb"] - r["uss_fork_mb"] for k, r in (("new", new), ("old", old))}))
    return rows


def report(r: dict, text_received: int, text_elapsed: float) -> None:
    print(
        f"{'ranks':>5} | {'raw fork':>9} | {'nbaccel trivial':>15} | {'ratio':>5} | {'accelerate':>10} | {'nbaccel/acc':>11} | {'nbaccel gloo+all_reduce':>23} | {'torch.mp fork':>13} | {'ratio':>5}"
    )
    for n in r["fork_floor"]:
        floor, triv, ar = r["fork_floor"][n], r["trivial"][n], r["all_reduce"][n]
        acc = r["accelerate"].get(n)
        mp = r["mp_all_reduce"].get(n)
        print(
            f"{n:>5} | {floor:7.1f}ms | {triv:13.1f}ms | {triv / floor:5.2f} | "
            + (f"{acc:8.1f}ms | {triv / acc:11.2f}" if acc else f"{'-':>10} | {'-':>11}")
            + f" | {ar:21.1f}ms | "
            + (f"{mp:11.1f}ms | {ar / mp:5.2f}" if mp else f"{'-':>13} | {'-':>5}")
        )
    report_phases(r)
    chatty = r["chatty_ranks"]
    print(f"relay throughput, {chatty} ranks x 50,000 lines, kernel-side sink: {r['relay_lines_per_s']:,.0f} lines/s, lost {r['relay_lost']}")
    print(
        f"relay throughput, text sink into the notebook (client side count): {chatty * 50_000 / text_elapsed:,.0f} lines/s, received {text_received:,} of {chatty * 50_000:,}"
    )
    print(
        f"memory per rank (USS): nbaccel rank {r['uss_rank_mb']:.1f} MiB vs raw fork child {r['uss_fork_mb']:.1f} MiB (extra {r['uss_rank_mb'] - r['uss_fork_mb']:.1f} MiB)"
    )


def report_phases(r: dict) -> None:
    """The breakdown: one row per phase, one column per rank count, beside the raw fork floor."""
    counts = list(r["phases"])
    print("\nwhere a trivial launch's time goes (medians, ms; kernel steps summed over ranks, rank steps the median rank; timers add a little):")
    print(f"{'phase':>34} | " + " | ".join(f"{n + ' rank' + ('s' if n != '1' else ''):>8}" for n in counts))
    print(f"{'raw fork floor':>34} | " + " | ".join(f"{r['fork_floor'][n]:8.2f}" for n in counts))
    for label in r["phases"][counts[0]]:
        print(f"{label:>34} | " + " | ".join(f"{r['phases'][n].get(label, 0.0):8.2f}" for n in counts))
    print()


if __name__ == "__main__":
    main()
