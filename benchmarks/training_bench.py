"""A small DDP training run on 2 CPU ranks under nbaccel, torchrun and Accelerate's notebook_launcher.

The same function (`train` below: an MLP under DDP on gloo, synthetic data, a fixed number of
steps) runs under each launcher in one run of this script:

* nbaccel.notebook_launcher in a fresh kernel: its first launch (cold) and later ones (warm);
* accelerate.notebook_launcher the same way, in another fresh kernel;
* torchrun, as a script (a fresh interpreter per rank: what `python -m torch.distributed.run` does).

Each kernel has imported torch and the launcher before the first launch, as a notebook would.

Reported per launcher: time to the first optimizer step (from the launching call, or from the
torchrun command for torchrun) and steady-state steps per second (after warm-up steps), medians,
and the ratios set as targets: steps/s >= 0.98x torchrun's, time to first step
<= 0.5x Accelerate's. Every rank writes its figures to a file, because Accelerate's launcher
drops return values.

    python benchmarks/training_bench.py [--runs 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

WARMUP_STEPS = 20


def train(out_dir: str, label: str, started_at: float, steps: int) -> None:
    """DDP on gloo: WARMUP_STEPS + ``steps`` optimizer steps; writes this rank's figures to out_dir."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    entered_s = time.time() - started_at
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    group_s = time.time() - started_at
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 128)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)
    x, y = torch.randn(64, 128, generator=generator), torch.randn(64, 128, generator=generator)
    first_step_s = steady_start = 0.0
    for step in range(WARMUP_STEPS + steps):
        if step == WARMUP_STEPS:
            steady_start = time.perf_counter()
        loss = F.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == 0:
            first_step_s = time.time() - started_at
    steps_per_s = steps / (time.perf_counter() - steady_start)
    figures = {
        "entered_s": entered_s,
        "group_s": group_s,
        "first_step_s": first_step_s,
        "steps_per_s": steps_per_s,
        "threads": torch.get_num_threads(),
        "world": dist.get_world_size(),
    }
    with open(os.path.join(out_dir, f"{label}.rank{rank}.json"), "w") as f:
        json.dump(figures, f)


KERNEL_SETUP = r"""
import json, os, socket, sys, time, contextlib, io
sys.path.insert(0, __HERE__)
import torch, nbaccel
from nbaccel.output.sinks import CollectingSink
from training_bench import train, read_figures

OUT, STEPS = __OUT__, __STEPS__

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def under_nbaccel(label):
    nbaccel.notebook_launcher(train, args=(OUT, label, time.time(), STEPS), num_processes=2, cpu=True, output=CollectingSink())
    return read_figures(OUT, label)

def under_accelerate(label):
    import accelerate
    with contextlib.redirect_stdout(io.StringIO()):
        accelerate.notebook_launcher(train, args=(OUT, label, time.time(), STEPS), num_processes=2, use_port=str(free_port()))
    return read_figures(OUT, label)
"""


def read_figures(out_dir: str, label: str) -> dict:
    """Both ranks' figures for one launch: time to first step (the later rank), steps/s (the mean)."""
    ranks = []
    for rank in (0, 1):
        with open(os.path.join(out_dir, f"{label}.rank{rank}.json")) as f:
            ranks.append(json.load(f))
    assert all(r["world"] == 2 for r in ranks), ranks
    return {
        "entered_s": max(r["entered_s"] for r in ranks),
        "group_s": max(r["group_s"] for r in ranks),
        "first_step_s": max(r["first_step_s"] for r in ranks),
        "steps_per_s": statistics.mean(r["steps_per_s"] for r in ranks),
        "threads": ranks[0]["threads"],
    }


def run_all(out_dir: str, runs: int, steps: int) -> dict[str, list[dict]]:
    """A first launch in a fresh kernel each for nbaccel and Accelerate, then ``runs`` rounds of
    nbaccel, Accelerate and torchrun in turn (interleaved, so a change in the machine's load
    falls on every launcher alike)."""
    results: dict[str, list[dict]] = {name: [] for name in ("nbaccel cold", "nbaccel warm", "accelerate cold", "accelerate warm", "torchrun")}
    with _kernel(out_dir, steps) as nb_kernel, _kernel(out_dir, steps) as acc_kernel:
        results["nbaccel cold"].append(_figures(nb_kernel, "under_nbaccel('nbaccel-cold')"))
        results["accelerate cold"].append(_figures(acc_kernel, "under_accelerate('accelerate-cold')"))
        for i in range(runs):
            results["nbaccel warm"].append(_figures(nb_kernel, f"under_nbaccel('nbaccel-warm{i}')"))
            results["accelerate warm"].append(_figures(acc_kernel, f"under_accelerate('accelerate-warm{i}')"))
            results["torchrun"].append(run_torchrun(out_dir, f"torchrun{i}", steps))
    return results


@contextlib.contextmanager
def _kernel(out_dir: str, steps: int) -> Iterator[Any]:
    from tests.kernel_harness import running_kernel

    setup = KERNEL_SETUP.replace("__HERE__", repr(HERE)).replace("__OUT__", repr(out_dir)).replace("__STEPS__", str(steps))
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        _ok(kernel.execute(setup, timeout=120))
        yield kernel


def _ok(run) -> None:
    if run.status != "ok":
        sys.exit(f"benchmark failed in the kernel:\n{run.error}\n{run.stderr[-2000:]}")


def _figures(kernel, expression: str) -> dict:
    run = kernel.execute(f"print('FIGURES' + json.dumps({expression}))", timeout=300)
    _ok(run)
    line = next(line for line in run.stdout.splitlines() if line.startswith("FIGURES"))
    return json.loads(line[len("FIGURES") :])


def run_torchrun(out_dir: str, label: str, steps: int, tries: int = 2) -> dict:
    """One torchrun of 2 ranks on this script; both ranks' figures. A free port can be taken by
    another program before torchrun binds it: then it is tried once more, on another port."""
    for attempt in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=1",
            "--nproc_per_node=2",
            "--rdzv_backend=static",
            "--node_rank=0",
            "--master_addr=127.0.0.1",
            f"--master_port={port}",
            os.path.abspath(__file__),
            "--as-rank",
            out_dir,
            label,
            repr(time.time()),
            str(steps),
        ]
        env = dict(os.environ, GLOO_SOCKET_IFNAME="lo")
        run = subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=300)
        if run.returncode == 0:
            return read_figures(out_dir, label)
        print(f"torchrun failed (exit {run.returncode}, try {attempt + 1} of {tries}):\n{run.stderr[-1500:]}", file=sys.stderr)
    sys.exit("torchrun failed; see above")


def median(figures: list[dict], key: str) -> float:
    return statistics.median(f[key] for f in figures)


def report(results: dict[str, list[dict]]) -> None:
    torchrun_rate = median(results["torchrun"], "steps_per_s")
    print("medians; times from the launching call (torchrun: from the command) to: the function entered, its process group up, its first optimizer step")
    print(f"{'launcher':>16} | {'runs':>4} | {'threads/rank':>12} | {'entered':>8} | {'group up':>8} | {'1st step':>8} | {'steps/s':>8} | {'vs torchrun':>11}")
    for name, figures in results.items():
        rate = median(figures, "steps_per_s")
        times = " | ".join(f"{median(figures, key) * 1e3:6.0f}ms" for key in ("entered_s", "group_s", "first_step_s"))
        print(f"{name:>16} | {len(figures):>4} | {figures[0]['threads']:>12} | {times} | {rate:8.1f} | {rate / torchrun_rate:10.3f}x")
    nb_rate = median(results["nbaccel warm"], "steps_per_s")
    warm = median(results["nbaccel warm"], "first_step_s") / median(results["accelerate warm"], "first_step_s")
    cold = median(results["nbaccel cold"], "first_step_s") / median(results["accelerate cold"], "first_step_s")
    print(f"steps/s, nbaccel warm / torchrun: {nb_rate / torchrun_rate:.3f}x (target >= 0.98x)")
    print(f"time to first step, nbaccel / accelerate: warm {warm:.2f}x, first launch in a fresh kernel {cold:.2f}x (target <= 0.5x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--as-rank", nargs=4, metavar=("OUT", "LABEL", "STARTED_AT", "STEPS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.as_rank:  # one torchrun rank
        out_dir, label, started_at, steps = args.as_rank
        train(out_dir, label, float(started_at), int(steps))
        return
    with tempfile.TemporaryDirectory(prefix="nbaccel-training-bench-") as out_dir:
        load_before = os.getloadavg()[0]
        results = run_all(out_dir, args.runs, args.steps)
    report(results)
    print(f"load average (1 min) before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
