"""Sharded models on persistent workers: pull that gathers, and DCP save/load, beside their anchors.

1. ``pool.pull`` of an FSDP2 model of SIZE (16 bias-free Linear layers, ``fully_shard`` on 2
   ranks) into this process (the pool's owner: the kernel in a notebook), against one
   ``torch.clone`` of a SIZE tensor here (the memcpy floor). The pulled tensors are memfds mapped
   without a copy, whose pages come in when first read: the pull is also timed with every tensor
   read once. Also this process's peak resident memory during the pull and that read (VmHWM,
   reset through /proc/self/clear_refs before each run) over SIZE.
2. ``pool.save`` / ``pool.load`` (torch.distributed.checkpoint, every rank writing its shards) of
   the same model on 2 and 4 ranks, against ``torch.save`` / ``torch.load`` of the full state dict
   in one process (this one), into the same folder on the same disk.

Medians over ``--runs``, interleaved with their anchors; ratios in the same run.

    python benchmarks/sharded_bench.py [--runs 5] [--gib 1.0] [--only pull|checkpoint]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch

import nbaccel

LAYERS = 16


def build(namespace: dict[str, Any], width: int) -> None:
    """On every rank: the model on meta, sharded, then its shards allocated and filled."""
    from torch.distributed.fsdp import fully_shard

    with torch.device("meta"):
        model = torch.nn.Sequential(*(torch.nn.Linear(width, width, bias=False) for _ in range(LAYERS)))
    fully_shard(model)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for param in model.parameters():
            param.to_local().fill_(0.5)
    namespace["big"] = model


def full_state(width: int) -> dict[str, torch.Tensor]:
    return {f"{i}.weight": torch.full((width, width), 0.5) for i in range(LAYERS)}


def read_once(state: dict[str, torch.Tensor]) -> None:
    for tensor in state.values():
        tensor.max()


def save_plain(width: int, path: str) -> float:
    """Seconds for ``torch.save`` of the full state dict (made before the clock starts)."""
    state = full_state(width)
    return timed(lambda: torch.save(state, path))


def load_average() -> list[str]:
    with open("/proc/loadavg") as loadavg:
        return loadavg.read().split()[:3]


def peak_reset() -> int:
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return _status("VmRSS")


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise LookupError(field)


def timed(function: Any) -> float:
    started = time.perf_counter()
    function()
    return time.perf_counter() - started


def bench_pull(width: int, size: int, runs: int) -> dict[str, Any]:
    source = torch.full((size // 4,), 0.5)
    pulls, touched, clones, peaks = [], [], [], []
    with nbaccel.start_workers(2) as pool:
        pool.run_task(lambda ns: build(ns, width))
        pool.pull("big")  # warm-up: malloc arenas, gloo's buffers
        for _ in range(runs):
            gc.collect()
            base = peak_reset()
            started = time.perf_counter()
            pulled = pool.pull("big")
            pulls.append(time.perf_counter() - started)
            read_once(pulled)  # the mapped memfds' pages come in as they are first read
            touched.append(time.perf_counter() - started)
            peaks.append((_status("VmHWM") - base) / size)
            assert sum(t.nbytes for t in pulled.values()) == size
            del pulled  # the last reference to its memory: the next run's base does not hold it
            clones.append(timed(lambda: source.clone()))
    return {
        "pull_s": statistics.median(pulls),
        "pull_and_read_s": statistics.median(touched),
        "clone_s": statistics.median(clones),
        "peak_over_size": statistics.median(peaks),
    }


def bench_checkpoint(width: int, ranks: int, runs: int, folder: str) -> dict[str, Any]:
    saves, loads, plain_saves, plain_loads = [], [], [], []
    plain = os.path.join(folder, "plain.pt")
    target = os.path.join(folder, f"dcp{ranks}")
    with nbaccel.start_workers(ranks) as pool:
        pool.run_task(lambda ns: build(ns, width))
        pool.save(target, "big")  # warm-up
        for _ in range(runs):
            saves.append(timed(lambda: pool.save(target, "big")))
            loads.append(timed(lambda: pool.load(target, "big")))
            plain_saves.append(save_plain(width, plain))
            gc.collect()
            plain_loads.append(timed(lambda: torch.load(plain)))
            gc.collect()
    shutil.rmtree(target, ignore_errors=True)
    return {
        "dcp_save_s": statistics.median(saves),
        "dcp_load_s": statistics.median(loads),
        "torch_save_s": statistics.median(plain_saves),
        "torch_load_s": statistics.median(plain_loads),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--only", choices=("pull", "checkpoint"), help="one part only (the machine is shared: each part takes minutes at 1 GiB)")
    args = parser.parse_args()
    os.environ.setdefault("NBACCEL_QUIET", "1")
    width = int((args.gib * 2**30 / 4 / LAYERS) ** 0.5) // 4 * 4
    size = LAYERS * width * width * 4
    print(f"model: {LAYERS} x ({width}, {width}) float32 = {size / 2**30:.2f} GiB; load average before: {load_average()}")
    results: dict[str, Any] = {"size_bytes": size}
    if args.only != "checkpoint":
        results["pull"] = print_pull(bench_pull(width, size, args.runs))
    if args.only != "pull":
        results.update(checkpoints(width, args.runs))
    print(f"load average after: {load_average()}")
    print(json.dumps(results))


def print_pull(pull: dict[str, Any]) -> dict[str, Any]:
    print(
        f"pull of the sharded model (2 ranks): {pull['pull_s'] * 1e3:.0f} ms, {pull['pull_and_read_s'] * 1e3:.0f} ms with every tensor read once; "
        f"one torch.clone of the same size: {pull['clone_s'] * 1e3:.0f} ms; ratio {pull['pull_s'] / pull['clone_s']:.2f}x "
        f"({pull['pull_and_read_s'] / pull['clone_s']:.2f}x read; target <= 2x); "
        f"this process's peak, the pulled model read, over the model's size: {pull['peak_over_size']:.2f}x (target <= 1.5x)"
    )
    return pull


def checkpoints(width: int, runs: int) -> dict[str, Any]:
    results = {}
    folder = tempfile.mkdtemp(prefix="nbaccel-sharded-bench-", dir=os.environ.get("BENCH_DIR"))
    try:
        for ranks in (2, 4):
            figures = bench_checkpoint(width, ranks, runs, folder)
            results[f"checkpoint_{ranks}"] = figures
            print(
                f"{ranks} ranks: DCP save {figures['dcp_save_s'] * 1e3:.0f} ms ({figures['dcp_save_s'] / figures['torch_save_s']:.2f}x torch.save "
                f"{figures['torch_save_s'] * 1e3:.0f} ms); DCP load {figures['dcp_load_s'] * 1e3:.0f} ms "
                f"({figures['dcp_load_s'] / figures['torch_load_s']:.2f}x torch.load {figures['torch_load_s'] * 1e3:.0f} ms)"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return results


if __name__ == "__main__":
    main()
