"""Widget messages a second and lines a second of a loud launch, per frontend policy.

Each rank prints as fast as it can for about 3 s inside one real ipykernel, driven through
jupyter_client. The cell is sent as each frontend sends it, and the kernel picks the view itself:

  - ``vscode``: VS Code's ``vscode-notebook-cell:`` cell id (the capped pace, about 10 messages/s);
  - ``jupyterlab``: JupyterLab's cell metadata (each panel at most every 50 ms);
  - ``classic``: no metadata after a widget manager opened the control comm (the classic
    Notebook, as nbaccel loaded at kernel start tells it): JupyterLab's pace;
  - ``text``: what nbclient and papermill get (labelled lines, no widgets; every line in the
    ranks' log files, each rank's lines in the cell capped: ``NBACCEL_TEXT_CAP``);
  - ``text-all``: the text view without the cap or logs (what terminal IPython gets), every line
    into the cell;
  - ``floor``: a sink that only counts lines (the relay alone), the anchor for lines/s.

For each, medians over ``--runs`` runs of: widget messages a second (opens, updates and closes,
by the kernel's own timestamps, between the view's display and its replacement), iopub
messages a second of any kind, and lines a second (all ranks' lines over the launch's wall time,
measured in the kernel), and the kilobytes of text the cell got (stream text and displays'
text/plain: what a saved notebook keeps of it). Lines/s is printed as a ratio to the floor of the
same run.

    python benchmarks/frontend_rate.py [--ranks 4 8] [--runs 3] [--seconds 3] [--frontends floor text text-all]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from tests.kernel.test_frontend_rate_kernel import VSCODE_CELL, _open_control_comm, _run_cell, _sent_at
from tests.kernel_harness import Execution, running_kernel

SETUP = r'''
import nbaccel, time

class CountingSink:
    """The floor: the relay's cost with a sink that only counts."""
    def launch_started(self, n, attempt, ranks=None): pass
    def output(self, rank, stream, lines): pass
    def event(self, rank, event): pass
    def rank_finished(self, outcome): pass
    def launch_finished(self, outcomes): pass
    def tick_in(self): return None
    def tick(self): pass

def loud(seconds):
    import os, sys, time
    rank = os.environ["RANK"]
    write = sys.stdout.write
    started, i = time.monotonic(), 0
    while time.monotonic() - started < seconds:
        for _ in range(1000):
            write(f"r{rank} line {i} " + "x" * 40 + "\n")
            i += 1
    return i
'''

CELL = "_t = time.perf_counter(); _c = nbaccel.notebook_launcher(loud, (SECONDS,), num_processes=RANKS, output=OUTPUT); print('lines', sum(_c), 'wall', time.perf_counter() - _t)"
FRONTENDS: dict[str, tuple[dict[str, Any], str]] = {
    "floor": ({}, "CountingSink()"),
    "text": ({}, "'text'"),
    "text-all": ({}, "__import__('nbaccel.output.text', fromlist=['RichTextSink']).RichTextSink()"),
    "classic": ({}, "None"),
    "jupyterlab": ({"deletedCells": [], "recordTiming": False, "cellId": "5a1b2c3d-0000-4000-8000-000000000001"}, "None"),
    "vscode": ({"cellId": VSCODE_CELL}, "None"),
}


def _figures(run: Execution) -> dict[str, float]:
    assert run.status == "ok", run.stderr[-2000:]
    words = run.stdout.rsplit("lines ", 1)[1].split()  # the cell's own last line (a text view also says "lines held back")
    lines, wall = int(words[0]), float(words[2])
    figures = {"lines/s": lines / wall, "iopub/s": len(run.messages) / wall, "widget msgs/s": 0.0, "cell kB": _cell_bytes(run) / 1000}
    shown, final = run.of_type("display_data"), run.of_type("update_display_data")
    if shown and final:
        begin, end = _sent_at(shown[0]), _sent_at(final[0])
        comms = [m for m in run.of_type("comm_open", "comm_msg", "comm_close") if begin <= _sent_at(m) < end]
        figures["widget msgs/s"] = len(comms) / max(end - begin, 1e-9)
    return figures


def _cell_bytes(run: Execution) -> int:
    """The text the cell got: stream text and each display's text/plain (the saved notebook's share)."""
    total = 0
    for message in run.messages:
        content = message["content"]
        if message["msg_type"] == "stream":
            total += len(content["text"].encode())
        elif message["msg_type"] in ("display_data", "update_display_data"):
            total += len(str(content.get("data", {}).get("text/plain", "")).encode())
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--frontends", nargs="+", choices=list(FRONTENDS), default=list(FRONTENDS))
    args = parser.parse_args()
    chosen = {name: FRONTENDS[name] for name in dict.fromkeys(["floor", *args.frontends])}  # the floor is the anchor: always run
    with tempfile.TemporaryDirectory() as logs, running_kernel(env={"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": logs}) as kernel:
        assert kernel.execute(SETUP + "\n%load_ext nbaccel").status == "ok"
        _open_control_comm(kernel)  # a widget manager that connects and never renders
        print(f"load average before: {Path('/proc/loadavg').read_text().split()[:3]}")
        print(f"{'ranks':>5} {'frontend':>10} {'widget msgs/s':>14} {'iopub/s':>9} {'lines/s':>10} {'vs floor':>9} {'cell kB':>9}")
        for ranks in args.ranks:
            results: dict[str, list[dict[str, float]]] = {name: [] for name in chosen}
            for _ in range(args.runs):
                for name, (metadata, output) in chosen.items():  # interleaved: load drifts hit all alike
                    cell = CELL.replace("SECONDS", str(args.seconds)).replace("RANKS", str(ranks)).replace("OUTPUT", output)
                    results[name].append(_figures(_run_cell(kernel, cell, metadata, timeout=120 + 10 * args.seconds)))
            floor = statistics.median(r["lines/s"] for r in results["floor"])
            for name, runs in results.items():
                med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
                print(
                    f"{ranks:>5} {name:>10} {med['widget msgs/s']:>14.1f} {med['iopub/s']:>9.0f} {med['lines/s']:>10,.0f} {med['lines/s'] / floor:>8.2f}x {med['cell kB']:>9,.0f}"
                )
        print(f"load average after: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
