"""Output throughput and kernel-side cost of the widget view, beside the text view and a floor.

8 ranks print as fast as they can inside one real ipykernel (driven through jupyter_client, as a
frontend drives it). For each sink it reports medians over several runs of:

  - lines/s through the whole pipeline (all ranks' lines / wall time of the launch);
  - none lost: every rank's line count checked (text: in the cell's stream output; widgets: the
    per-rank log files, and "shown + dropped" in the final view);
  - the kernel's CPU seconds for the launch (the kernel process itself, not the ranks);
  - iopub messages and bytes the frontend receives;
  - kernel responsiveness: round trips of kernel_info_request on the control channel every 50 ms
    while the ranks print (median and worst);
  - the floor: a sink that only counts lines (the relay alone).

    python benchmarks/widgets_bench.py [--ranks 8] [--lines 20000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel_harness import Kernel, running_kernel

SETUP = r'''
import nbaccel

class CountingSink:
    """The floor: the relay's cost with a sink that only counts."""
    def __init__(self): self.counts = {}
    def launch_started(self, n, attempt, ranks=None): pass
    def output(self, rank, stream, lines): self.counts[rank] = self.counts.get(rank, 0) + len(lines)
    def event(self, rank, event): pass
    def rank_finished(self, outcome): pass
    def launch_finished(self, outcomes): pass
    def tick_in(self): return None
    def tick(self): pass

def chatty(lines):
    import os, sys
    rank = os.environ["RANK"]
    write = sys.stdout.write
    for i in range(lines):
        write(f"r{rank} line {i} " + "x" * 40 + "\n")
'''

LAUNCH = {
    "floor": "_s = CountingSink(); nbaccel.notebook_launcher(chatty, (LINES,), num_processes=RANKS, output=_s); print(_s.counts)",
    "text": "nbaccel.notebook_launcher(chatty, (LINES,), num_processes=RANKS, output='text')",
    "widgets": "nbaccel.notebook_launcher(chatty, (LINES,), num_processes=RANKS, output='widgets')",
}


class Pinger(threading.Thread):
    """kernel_info_request on the control channel every ``period`` s; keeps the round trips."""

    def __init__(self, kernel: Kernel, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.kernel, self.period = kernel, period
        self.samples: list[float] = []
        self.done = threading.Event()

    def run(self) -> None:
        client = self.kernel.client
        while not self.done.is_set():
            sent = time.perf_counter()
            msg = client.session.msg("kernel_info_request", {})
            client.control_channel.send(msg)
            while True:
                try:
                    reply = client.control_channel.get_msg(timeout=10)
                except queue.Empty:
                    self.samples.append(10.0)
                    break
                if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                    self.samples.append(time.perf_counter() - sent)
                    break
            self.done.wait(self.period)


def run_once(kernel: Kernel, mode: str, ranks: int, lines: int) -> dict[str, Any]:
    code = LAUNCH[mode].replace("LINES", str(lines)).replace("RANKS", str(ranks))
    process = psutil.Process(kernel.pid)
    cpu = process.cpu_times()
    pinger = Pinger(kernel)
    pinger.start()
    run = kernel.execute(code, timeout=600)
    pinger.done.set()
    pinger.join()
    after = process.cpu_times()
    assert run.status == "ok", run.stderr
    messages = run.messages
    return {
        "seconds": run.elapsed,
        "lines_per_s": ranks * lines / run.elapsed,
        "kernel_cpu_s": (after.user + after.system) - (cpu.user + cpu.system),
        "iopub_messages": len(messages),
        "iopub_mb": sum(len(json.dumps(m["content"])) for m in messages) / 1e6,
        "ping_median_ms": statistics.median(pinger.samples) * 1e3 if pinger.samples else float("nan"),
        "ping_max_ms": max(pinger.samples) * 1e3 if pinger.samples else float("nan"),
        "lost": lost_lines(mode, run, ranks, lines),
    }


def lost_lines(mode: str, run: Any, ranks: int, lines: int) -> int:
    """Lines that did not arrive (0 expected), checked the way each view keeps them."""
    if mode == "floor":
        counts = eval(run.stdout.strip().splitlines()[-1])  # a dict we printed ourselves
        return sum(lines - counts.get(r, 0) for r in range(ranks))
    if mode == "text":
        seen = [0] * ranks
        for match in re.finditer(r"^\[rank (\d+)\] r\1 line ", run.stdout, re.MULTILINE):
            seen[int(match.group(1))] += 1
        return sum(lines - n for n in seen)
    final = run.of_type("update_display_data")[-1]["content"]["data"]["text/plain"]
    folder = Path(final.splitlines()[1].removeprefix("full logs: "))
    lost = 0
    for rank, section in enumerate(final.split("── rank ")[1:]):
        with open(folder / f"rank{rank}.log") as log:
            logged = sum(1 for _ in log)
        shown = sum(1 for line in section.splitlines() if line.startswith(f"r{rank} line "))
        dropped = re.search(r"… ([\d,]+) earlier lines", section)
        lost += (lines - logged) + (lines - shown - (int(dropped.group(1).replace(",", "")) if dropped else 0))
    return lost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--lines", type=int, default=20_000, help="lines each rank prints")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    results: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as logs, running_kernel(env={"NBACCEL_LOG_DIR": logs, "NBACCEL_OUTPUT": ""}) as kernel:
        assert kernel.execute(SETUP).status == "ok"
        kernel.execute(LAUNCH["floor"].replace("LINES", "10").replace("RANKS", "2"))  # warm-up: imports, first fork
        for _ in range(options.runs):
            for mode in LAUNCH:  # interleaved, so a slow spell of the machine hits every mode alike
                results.setdefault(mode, []).append(run_once(kernel, mode, options.ranks, options.lines))
    report(results, options)


def report(results: dict[str, list[dict[str, Any]]], options: argparse.Namespace) -> None:
    total = options.ranks * options.lines
    print(f"{options.ranks} ranks x {options.lines:,} lines = {total:,} lines per launch; medians of {options.runs} runs")
    header = f"{'sink':8} {'seconds':>8} {'lines/s':>10} {'vs floor':>8} {'kernel CPU s':>12} {'iopub msgs':>10} {'iopub MB':>9} {'ping med ms':>11} {'ping max ms':>11} {'lost':>5}"
    print(header)
    floor = statistics.median(r["lines_per_s"] for r in results["floor"])
    for mode, runs in results.items():
        med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        worst_ping = max(r["ping_max_ms"] for r in runs)
        lost = max(r["lost"] for r in runs)
        print(
            f"{mode:8} {med['seconds']:8.2f} {med['lines_per_s']:10,.0f} {med['lines_per_s'] / floor:8.2f} {med['kernel_cpu_s']:12.2f} "
            f"{med['iopub_messages']:10,.0f} {med['iopub_mb']:9.2f} {med['ping_median_ms']:11.1f} {worst_ping:11.1f} {lost:5d}"
        )


if __name__ == "__main__":
    main()
