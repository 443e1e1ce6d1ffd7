"""Persistent workers from a notebook's point of view: start time and per-cell round trips.

Everything runs in one fresh ipykernel (NBACCEL_OUTPUT=text), driven through jupyter_client as a
notebook frontend drives it. A round trip is measured on the client, from sending the
execute_request to receiving its execute_reply. Measured, as medians over many runs:

- ``%distributed start -n N`` (2 and 4 CPU ranks): the client's round trip and the pool's own
  start time inside the kernel; the first start is reported apart (it imports the rank modules);
- a trivial ``%%distributed`` cell (``pass``) and one all_reduce cell on 2- and 4-rank workers,
  beside the same cells as one-shot launches (``%%distributed -n N``), and a plain local
  ``pass`` cell in the same kernel, measured interleaved with them; ratios are to that local cell.

Targets: the trivial cell on 2 workers within 1.3x the local cell; start < 0.5 s for 4
CPU ranks. ``--profile`` adds a cProfile of the kernel side of the trivial pool cell.
``--against DIR`` (another checkout) measures both trees in the same run: a kernel each, its tree
first on PYTHONPATH, the cells interleaved round by round, then both side by side (new/old).

    python benchmarks/pool_bench.py [--runs 200] [--one-shot-runs 15] [--ranks 2,4] [--profile] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import side_by_side  # beside this script

from tests.kernel_harness import Kernel

SETUP = "%load_ext nbaccel\nimport torch, torch.distributed as dist"
LOCAL = "pass"
TRIVIAL = "%%distributed{opts}\npass"
ALL_REDUCE = "%%distributed{opts}\nt = torch.ones(1, device=state.device)\ndist.all_reduce(t)"
POOL_START = "import time as _t; _s = _t.perf_counter(); get_ipython().run_line_magic('distributed', 'start -n {n}'); _took = _t.perf_counter() - _s"
# The kernel's own share of a cell, as CPU time: the cell run by IPython inside the kernel, many
# times (no client, no messages), so other processes' load changes it far less than a round trip.
KERNEL_CPU = """
import time as _t
_ip = get_ipython()
_c = _t.process_time()
for _ in range({runs}):
    _ip.run_cell({code!r})
print((_t.process_time() - _c) / {runs} * 1e3)
"""
PROFILE = """
import cProfile, io, pstats
_ip = get_ipython()
_profile = cProfile.Profile()
_profile.enable()
for _ in range({runs}):
    _ip.run_cell_magic("distributed", "", "pass")
_profile.disable()
_out = io.StringIO()
pstats.Stats(_profile, stream=_out).sort_stats("cumulative").print_stats(30)
print(_out.getvalue())
"""


def round_trip(kernel: Kernel, code: str) -> float:
    """Seconds from sending ``code``'s execute_request to receiving its execute_reply."""
    client = kernel.client
    started = time.perf_counter()
    msg_id = client.execute(code, store_history=True)
    while True:
        reply = client.get_shell_msg(timeout=120)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    took = time.perf_counter() - started
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"{code!r} failed in the kernel: {reply['content']}")
    _drain(kernel, msg_id)  # outside the timing: the next request starts from a quiet channel
    return took


def _drain(kernel: Kernel, msg_id: str) -> None:
    while True:
        msg = kernel.client.get_iopub_msg(timeout=60)
        if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return


def interleaved(kernels: dict[str, Kernel], cells: dict[str, str], runs: int) -> dict[str, dict[str, float]]:
    """Tree -> median round trip of each cell, in ms: every kernel runs the cells in turn, ``runs``
    times (after a warm-up), the trees' order swapped every round."""
    samples: dict[str, dict[str, list[float]]] = {label: {name: [] for name in cells} for label in kernels}
    for index in range(runs + 1):
        for label in side_by_side.turns(index, list(kernels)):
            for name, code in cells.items():
                took = round_trip(kernels[label], code)
                if index:
                    samples[label][name].append(took)
    return {label: {name: statistics.median(values) * 1e3 for name, values in cells_.items()} for label, cells_ in samples.items()}


def kernel_cpu(kernels: dict[str, Kernel], cells: dict[str, str], runs: int) -> dict[str, dict[str, float]]:
    """Tree -> the kernel's CPU time per cell, in ms, each cell run ``runs`` times inside the kernel
    (in 10 turns per tree, interleaved as the round trips are)."""
    turns = 10
    samples: dict[str, dict[str, list[float]]] = {label: {name: [] for name in cells} for label in kernels}
    for index in range(turns):
        for label in side_by_side.turns(index, list(kernels)):
            for name, code in cells.items():
                run = kernels[label].execute(KERNEL_CPU.format(runs=max(1, runs // turns), code=code), timeout=600)
                samples[label][name].append(float(run.stdout.split()[-1]))
    return {label: {name: statistics.median(values) for name, values in by_cell.items()} for label, by_cell in samples.items()}


def start_times(kernels: dict[str, Kernel], n: int, runs: int) -> dict[str, tuple[float, float, float]]:
    """Tree -> (first start, median client round trip, median in-kernel start time), ms, of N workers."""
    first = {}
    for label, kernel in kernels.items():
        first[label] = round_trip(kernel, POOL_START.format(n=n)) * 1e3
        round_trip(kernel, "%distributed stop")
    trips: dict[str, list[float]] = {label: [] for label in kernels}
    inside: dict[str, list[float]] = {label: [] for label in kernels}
    for index in range(runs):
        for label in side_by_side.turns(index, list(kernels)):
            trips[label].append(round_trip(kernels[label], POOL_START.format(n=n)))
            inside[label].append(float(kernels[label].execute("print(_took)").stdout))
            round_trip(kernels[label], "%distributed stop")
    return {label: (first[label], statistics.median(trips[label]) * 1e3, statistics.median(inside[label]) * 1e3) for label in kernels}


def measure(kernels: dict[str, Kernel], runs: int, one_shot_runs: int, ranks: tuple[int, ...] = (2, 4)) -> dict[str, dict[str, object]]:
    """Tree -> its figures, every tree measured in the same rounds."""
    figures: dict[str, dict[str, object]] = {label: {} for label in kernels}

    def keep(name: str, by_tree: dict[str, object]) -> None:
        for label, value in by_tree.items():
            figures[label][name] = value

    for n in ranks:
        keep(f"start {n}", dict(start_times(kernels, n, max(5, runs // 20))))
        for kernel in kernels.values():
            round_trip(kernel, f"%distributed start -n {n}")
        keep(f"pool {n}", dict(interleaved(kernels, {"local": LOCAL, "trivial": TRIVIAL.format(opts=""), "all_reduce": ALL_REDUCE.format(opts="")}, runs)))
        keep(f"kernel cpu {n}", dict(kernel_cpu(kernels, {"local": LOCAL, "trivial": TRIVIAL.format(opts="")}, runs)))
        for kernel in kernels.values():
            round_trip(kernel, "%distributed stop")
        cells = {"local": LOCAL, "trivial": TRIVIAL.format(opts=f" -n {n}"), "all_reduce": ALL_REDUCE.format(opts=f" -n {n}")}
        keep(f"one-shot {n}", dict(interleaved(kernels, cells, one_shot_runs)))
    return figures


def report(figures: dict[str, object], runs: int, one_shot_runs: int, ranks: tuple[int, ...] = (2, 4)) -> None:
    print(f"round trips from the client (execute_request -> execute_reply), medians; {runs} runs on workers, {one_shot_runs} one-shot")
    print(f"{'cell':<34} | {'ms':>8} | {'x local pass':>12}")
    for n in ranks:
        for mode in ("pool", "one-shot"):
            cells = figures[f"{mode} {n}"]
            assert isinstance(cells, dict)
            local = cells["local"]
            print(f"{'local pass (same phase)':<34} | {local:8.2f} | {1.0:12.2f}")
            for name in ("trivial", "all_reduce"):
                label = f"{'workers' if mode == 'pool' else 'one-shot'} {n} ranks: {name}"
                print(f"{label:<34} | {cells[name]:8.2f} | {cells[name] / local:12.2f}")
    for n in ranks:
        cpu = figures[f"kernel cpu {n}"]
        assert isinstance(cpu, dict)
        print(f"the kernel's CPU time per cell, {n} workers: trivial cell {cpu['trivial']:.3f} ms, local pass {cpu['local']:.3f} ms")
    for n in ranks:
        first, trip, inside = figures[f"start {n}"]  # type: ignore[misc]
        print(f"%distributed start -n {n}: first {first:.0f} ms; then median {trip:.1f} ms round trip, {inside:.1f} ms inside the kernel")
    if ranks != (2, 4):
        return  # the targets are set for 2 and 4 CPU ranks
    trivial, local = figures["pool 2"]["trivial"], figures["pool 2"]["local"]  # type: ignore[index]
    start4 = figures["start 4"][1]  # type: ignore[index]
    print(f"target: trivial cell on 2 workers <= 1.3x local: {trivial / local:.2f}x -> {'met' if trivial <= 1.3 * local else 'MISSED'}")
    print(f"target: start of 4 CPU workers < 500 ms (round trip): {start4:.0f} ms -> {'met' if start4 < 500 else 'MISSED'}")


def comparison(new: dict[str, object], old: dict[str, object], ranks: tuple[int, ...]) -> list[tuple[str, dict[str, float]]]:
    """Both trees' figures as (name, {"new": value, "old": value}) rows for ``side_by_side.compare``."""
    rows: list[tuple[str, dict[str, float]]] = []
    trees = {"new": new, "old": old}
    for n in ranks:
        for mode in ("pool", "one-shot"):
            cells = {label: tree[f"{mode} {n}"] for label, tree in trees.items()}
            rows.append((f"{mode} {n} ranks: local pass", {label: c["local"] for label, c in cells.items()}))  # type: ignore[index]
            for name in ("trivial", "all_reduce"):
                rows.append((f"{mode} {n} ranks: {name}", {label: c[name] for label, c in cells.items()}))  # type: ignore[index]
                rows.append((f"  {mode} {n} ranks: {name} / local pass (x)", {label: c[name] / c["local"] for label, c in cells.items()}))  # type: ignore[index]
        cpu = {label: tree[f"kernel cpu {n}"] for label, tree in trees.items()}
        rows.append((f"kernel CPU per trivial cell, {n} workers", {label: c["trivial"] for label, c in cpu.items()}))  # type: ignore[index]
        rows.append((f"start -n {n}: round trip", {label: tree[f"start {n}"][1] for label, tree in trees.items()}))  # type: ignore[index]
    return rows


def rank_counts(text: str) -> tuple[int, ...]:
    """``"1,2"`` -> (1, 2): the process counts to measure."""
    counts = tuple(int(part) for part in text.split(","))
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected positive counts separated by commas, e.g. 2,4; got {text!r}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200, help="round trips per cell on workers")
    parser.add_argument("--one-shot-runs", type=int, default=15, help="round trips per one-shot cell")
    parser.add_argument("--ranks", type=rank_counts, default=(2, 4), metavar="2,4", help="worker counts to measure (default 2,4; on GPUs at most one per GPU)")
    parser.add_argument("--profile", action="store_true", help="also profile the kernel side of the trivial pool cell")
    parser.add_argument("--against", type=side_by_side.checkout, metavar="DIR", help="another checkout of nbaccel, measured in the same run, round by round")
    args = parser.parse_args()
    checkouts = side_by_side.trees(args.against)
    load_before = side_by_side.load_average()
    with side_by_side.kernels(checkouts, {"NBACCEL_OUTPUT": "text"}) as kernels:
        for kernel in kernels.values():
            round_trip(kernel, SETUP)
        figures = measure(kernels, args.runs, args.one_shot_runs, args.ranks)
        if args.profile:
            kernel = kernels["new"]
            round_trip(kernel, f"%distributed start -n {args.ranks[0]}")
            print(kernel.execute(PROFILE.format(runs=args.runs), timeout=600).stdout)
            round_trip(kernel, "%distributed stop")
    for label, tree in figures.items():
        if len(figures) > 1:
            print(f"\n== {label}: {checkouts[label]} ==")
        report(tree, args.runs, args.one_shot_runs, args.ranks)
    if len(figures) > 1:
        print("\nside by side, interleaved round by round (medians, ms):")
        side_by_side.compare(comparison(figures["new"], figures["old"], args.ranks))
    print(f"load average {load_before} before, {side_by_side.load_average()} after")


if __name__ == "__main__":
    main()
