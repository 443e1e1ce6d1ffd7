"""GPU tier (marker ``gpu``; skipped where no CUDA device is visible)."""

from __future__ import annotations

import pytest

import nbaccel
from nbaccel.launch.preflight import fork_hazards

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def nccl_all_reduce() -> tuple:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    value = torch.tensor([state.process_index + 1.0], device=state.device)
    dist.all_reduce(value)
    return state.backend, str(state.device), value  # a CUDA tensor: must come back on the CPU


def test_one_rank_per_gpu_with_nccl_and_results_on_the_cpu() -> None:
    import torch

    n = torch.cuda.device_count()
    results = nbaccel.notebook_launcher(nccl_all_reduce, num_processes=n)
    assert [r[0] for r in results] == ["nccl"] * n
    assert [r[1] for r in results] == [f"cuda:{i}" for i in range(n)]
    assert all(r[2].device.type == "cpu" and r[2].item() == n * (n + 1) / 2 for r in results)
    assert not torch.cuda.is_initialized()  # the kernel never touched CUDA
    assert fork_hazards() == []


SPAWN_FALLBACK = """
import torch, nbaccel
from nbaccel.launch.preflight import fork_hazards
torch.zeros(1, device="cuda")  # what a notebook does by accident
assert fork_hazards()
try:
    nbaccel.notebook_launcher(int, num_processes=1, start_method="fork")
except nbaccel.PreflightError as error:
    assert "CUDA is already initialised" in str(error)
else:
    raise AssertionError("fork was not refused")
from tests.gpu.test_gpu import nccl_all_reduce
print(nbaccel.notebook_launcher(nccl_all_reduce, num_processes=1)[0][0])
"""


def test_cuda_initialised_in_the_kernel_falls_back_to_spawn() -> None:
    import subprocess
    import sys

    # In a process of its own: CUDA, once initialised, stays so for every later test.
    run = subprocess.run([sys.executable, "-c", SPAWN_FALLBACK], capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("nccl")
    assert "starting the ranks with spawn instead of fork" in run.stderr
