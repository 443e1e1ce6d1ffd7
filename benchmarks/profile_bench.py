"""What ``profile=`` costs a training run, and what the kernel's resource sampler costs.

Profiling: the training benchmark's ``train`` (an MLP under DDP on 2 CPU ranks, gloo) runs under
``nbaccel.notebook_launcher`` with and without ``profile=``, alternating, in this process. Reported:
median steady-state steps/s of each and their ratio (profiled / plain), the median launch wall time
of each (the profiled one includes exporting, sending, writing and merging the traces) and the
merged trace's size.

Sampler: ``ResourceSampler.sample`` over live sleeping child processes (as many as ``--ranks``),
median time per sample beside a floor measured in the same run (reading one /proc file), and the
share of one core it takes at the loop's 1 Hz. Then the same with GPU fields: the ranks given a
device map (two ranks a GPU), NVML answered by the tests' fake ``libnvidia-ml.so.1`` (built with
``cc``; it reads a small file per call, which a real driver does not: the figure is nbaccel's own
cost plus the fake's, not a real driver's), sampled alternately with a CPU-only sampler.

    python benchmarks/profile_bench.py [--runs 5] [--steps 300] [--ranks 8]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)


def bench_profiling(runs: int, steps: int) -> dict[str, float]:
    from training_bench import read_figures, train

    import nbaccel
    from nbaccel.output.sinks import CollectingSink

    plain: list[float] = []
    profiled: list[float] = []
    walls: dict[str, list[float]] = {"plain": [], "profiled": []}
    size = 0
    with tempfile.TemporaryDirectory() as out:
        for run in range(runs):
            for kind in ("plain", "profiled"):
                label = f"{kind}{run}"
                options = {"profile": os.path.join(out, label)} if kind == "profiled" else {}
                started = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):  # the profiled launch prints its summary (part of its cost)
                    nbaccel.notebook_launcher(train, args=(out, label, time.time(), steps), num_processes=2, cpu=True, output=CollectingSink(), **options)
                walls[kind].append(time.perf_counter() - started)
                (plain if kind == "plain" else profiled).append(read_figures(out, label)["steps_per_s"])
                if kind == "profiled":
                    size = os.path.getsize(os.path.join(out, label, "trace.json"))
    return {
        "plain_steps_per_s": statistics.median(plain),
        "profiled_steps_per_s": statistics.median(profiled),
        "ratio": statistics.median(profiled) / statistics.median(plain),
        "plain_wall_s": statistics.median(walls["plain"]),
        "profiled_wall_s": statistics.median(walls["profiled"]),
        "trace_bytes": size,
    }


def bench_sampler(ranks: int, samples: int = 2000) -> dict[str, float]:
    from nbaccel.launch.sampler import ResourceSampler

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(ranks)]
    try:
        sampler = ResourceSampler({rank: child.pid for rank, child in enumerate(children)}, now=time.monotonic())
        costs, floors = [], []
        for i in range(samples):
            started = time.perf_counter()
            sampler.sample(float(i + 1))
            costs.append(time.perf_counter() - started)
            started = time.perf_counter()
            with open(f"/proc/{children[0].pid}/statm", "rb") as statm:
                statm.read()
            floors.append(time.perf_counter() - started)
    finally:
        for child in children:
            child.kill()
            child.wait()
    per_sample = statistics.median(costs)
    return {
        "ranks": ranks,
        "per_sample_us": per_sample * 1e6,
        "floor_us": statistics.median(floors) * 1e6,
        "per_sample_over_floor": per_sample / statistics.median(floors),
        "core_percent_at_1hz": per_sample * 100,
    }


def bench_gpu_sampler(ranks: int, samples: int = 2000) -> dict[str, float]:
    from nbaccel.launch.sampler import ResourceSampler
    from tests.devices.fakes import build_fake_nvml, write_use

    children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) for _ in range(ranks)]
    saved = dict(os.environ)
    try:
        with tempfile.TemporaryDirectory() as folder:
            os.environ["NBACCEL_NVML_LIBRARY"] = str(build_fake_nvml(pathlib.Path(folder)))
            os.environ["FAKE_NVML_GPUS"] = ";".join(f"NVIDIA H200|GPU-{gpu:04d}|9|0|" for gpu in range((ranks + 1) // 2))
            os.environ["FAKE_NVML_USE"] = os.path.join(folder, "use.txt")
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            pids = {rank: child.pid for rank, child in enumerate(children)}
            listed: dict[int, dict[int, int | None]] = {gpu: {} for gpu in range((ranks + 1) // 2)}
            for rank, pid in pids.items():
                listed[rank // 2][pid] = 2**30
            write_use(pathlib.Path(folder, "use.txt"), listed, dict.fromkeys(listed, 50))
            plain = ResourceSampler(pids, now=time.monotonic())
            gpu = ResourceSampler(pids, now=time.monotonic(), gpus={rank: rank // 2 for rank in pids})
            assert gpu.sample(0.5)[0]["gpu_mem"] == 2**30, "the fake NVML did not answer"
            costs: dict[str, list[float]] = {"plain": [], "gpu": [], "nvml": []}
            for i in range(samples):
                for kind, sample in (("plain", plain.sample), ("gpu", gpu.sample), ("nvml", lambda _: gpu.gpu.sample(pids))):  # type: ignore[union-attr]
                    started = time.perf_counter()
                    sample(float(i + 1))
                    costs[kind].append(time.perf_counter() - started)
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for child in children:
            child.kill()
            child.wait()
    plain_us, gpu_us = statistics.median(costs["plain"]) * 1e6, statistics.median(costs["gpu"]) * 1e6
    return {
        "ranks": ranks,
        "gpus": (ranks + 1) // 2,
        "plain_us": plain_us,
        "with_gpu_us": gpu_us,
        "nvml_calls_us": statistics.median(costs["nvml"]) * 1e6,  # the fake's calls alone, one list and one utilisation a GPU
        "ratio": gpu_us / plain_us,
        "core_percent_at_1hz": gpu_us / 1e4,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--skip-profiling", action="store_true")
    args = parser.parse_args()
    results = {"sampler": bench_sampler(args.ranks), "sampler_2": bench_sampler(2)}
    results["sampler_gpu"], results["sampler_gpu_2"] = bench_gpu_sampler(args.ranks), bench_gpu_sampler(2)
    if not args.skip_profiling:
        results["profiling"] = bench_profiling(args.runs, args.steps)
    with open("/proc/loadavg") as load:
        results["loadavg"] = load.read().split()[:3]
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
