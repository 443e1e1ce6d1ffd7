"""GPU tier, launcher level (marker ``gpu``; skipped where no CUDA device is visible).

Run by ``scripts/gpu-check``. The test process itself must never initialise CUDA: every rank
is forked from it, and a fork after CUDA is initialised breaks (the spawn fallback test makes
its own interpreter for that reason).

Imports internals (launch.preflight): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import nbaccel
from nbaccel.launch.preflight import fork_hazards, never_fork

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

FORKED_FROM: int | None = None  # set before a launch: a forked rank has it, a spawned one re-imports None


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()  # NVML: counts without initialising CUDA here


needs_two_gpus = pytest.mark.skipif("gpu_count() < 2", reason="needs two CUDA GPUs")


def nccl_all_reduce() -> tuple:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    value = torch.tensor([state.process_index + 1.0], device=state.device)
    dist.all_reduce(value)
    return state.backend, str(state.device), value, FORKED_FROM  # a CUDA tensor: must come back on the CPU


def check_nccl_launch(n: int) -> None:
    import torch

    global FORKED_FROM
    FORKED_FROM = os.getpid()
    results = nbaccel.notebook_launcher(nccl_all_reduce, num_processes=n)
    assert [r[0] for r in results] == ["nccl"] * n
    assert [r[1] for r in results] == [f"cuda:{i}" for i in range(n)]
    assert all(r[2].device.type == "cpu" and r[2].item() == n * (n + 1) / 2 for r in results)
    assert [r[3] for r in results] == [os.getpid()] * n, "the ranks were not forked"
    assert not torch.cuda.is_initialized()  # the kernel never touched CUDA
    assert never_fork(fork_hazards()) == []  # libgomp's pool may have started: not a CUDA matter


def test_nccl_initialises_in_one_forked_rank_and_its_cuda_tensor_arrives_on_the_cpu() -> None:
    check_nccl_launch(1)


@needs_two_gpus
def test_nccl_all_reduce_across_two_forked_ranks() -> None:
    check_nccl_launch(2)


def results_of_every_kind() -> dict:
    import torch

    state = nbaccel.PartialState()
    on_gpu = torch.arange(4.0, device=state.device)
    model = torch.nn.Linear(2, 2).to(state.device)
    return {"tensor": on_gpu, "nested": [(on_gpu * 2,)], "module": model, "scalar": on_gpu.sum()}


def test_gpu_tensors_nested_and_modules_in_results_arrive_on_the_cpu() -> None:
    import torch

    [result] = nbaccel.notebook_launcher(results_of_every_kind, num_processes=1)
    assert result["tensor"].device.type == "cpu" and result["tensor"].tolist() == [0, 1, 2, 3]
    assert result["nested"][0][0].device.type == "cpu"
    assert result["scalar"].device.type == "cpu" and result["scalar"].item() == 6
    module = result["module"]  # a module comes back as its state_dict, on the CPU
    assert all(v.device.type == "cpu" for v in (module.values() if isinstance(module, dict) else module.state_dict().values()))
    assert not torch.cuda.is_initialized()


def device_placement() -> tuple:
    import torch

    return int(os.environ["LOCAL_RANK"]), torch.cuda.current_device(), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_each_rank_is_pinned_to_the_gpu_of_its_local_rank() -> None:
    n = gpu_count()
    results = nbaccel.notebook_launcher(device_placement, num_processes=n)
    assert [(local, current) for local, current, _ in results] == [(i, i) for i in range(n)]


def test_gpus_picks_the_devices_and_the_rank_sees_only_its_own() -> None:
    last = gpu_count() - 1
    [(local, current, visible)] = nbaccel.notebook_launcher(device_placement, gpus=[last])
    assert (local, current) == (0, 0)  # the one rank's only visible device is physical GPU `last`
    assert visible == str(last)


RESPECTS_KERNEL_VISIBLE_DEVICES = """
import os, nbaccel
from tests.gpu.test_gpu import device_placement
print(nbaccel.notebook_launcher(device_placement, num_processes=1)[0][2])
"""


@needs_two_gpus
def test_a_kernel_limited_by_cuda_visible_devices_keeps_that_device() -> None:
    # The kernel may use only physical GPU 1: its device 0 is GPU 1, and so must be the rank's.
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="1")
    run = subprocess.run([sys.executable, "-c", RESPECTS_KERNEL_VISIBLE_DEVICES], check=False, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "1", "the rank was given a GPU the kernel may not use"


def precision_seen() -> dict:
    import accelerate
    import torch

    nb_state = nbaccel.AcceleratorState()
    accelerator = accelerate.Accelerator()
    x = torch.ones(8, 8, device=accelerator.device)
    with accelerator.autocast():
        accelerate_dtype = (x @ x).dtype
    with torch.autocast(nb_state.device.type, dtype={"bf16": torch.bfloat16, "fp16": torch.float16}[nb_state.mixed_precision]):
        nbaccel_dtype = (x @ x).dtype
    return {
        "nbaccel": nb_state.mixed_precision,
        "accelerate": accelerator.mixed_precision,
        "accelerate_type": str(accelerator.distributed_type).split(".")[-1],
        "accelerate_autocast": str(accelerate_dtype),
        "nbaccel_autocast": str(nbaccel_dtype),
    }


def test_bf16_from_the_launch_reaches_autocast_through_nbaccel_and_accelerate() -> None:
    pytest.importorskip("accelerate")
    n = min(gpu_count(), 2)
    results = nbaccel.notebook_launcher(precision_seen, num_processes=n, mixed_precision="bf16")
    for seen in results:
        assert (seen["nbaccel"], seen["accelerate"]) == ("bf16", "bf16"), seen
        assert seen["accelerate_type"] == "MULTI_GPU", seen  # also for one rank: LOCAL_RANK is set, CUDA is there
        assert seen["accelerate_autocast"] == seen["nbaccel_autocast"] == "torch.bfloat16", seen


SPAWN_FALLBACK = """
import torch, nbaccel
from nbaccel.launch.preflight import fork_hazards
torch.zeros(1, device="cuda")  # what a notebook does by accident
assert fork_hazards()
try:
    nbaccel.notebook_launcher(int, num_processes=1, start_method="fork")
except nbaccel.PreflightError as error:
    assert "CUDA is already initialised" in str(error), str(error)
else:
    raise AssertionError("fork was not refused")
from tests.gpu.test_gpu import nccl_all_reduce
print(nbaccel.notebook_launcher(nccl_all_reduce, num_processes=1)[0][0])
"""


def test_cuda_initialised_in_the_kernel_falls_back_to_spawn_and_refuses_fork() -> None:
    # In a process of its own: CUDA, once initialised, stays so for every later test.
    env = {k: v for k, v in os.environ.items() if k != "NBACCEL_QUIET"}  # the notice is what is tested
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(SPAWN_FALLBACK)], check=False, capture_output=True, text=True, timeout=240, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("nccl")
    notices = [line for line in run.stdout.splitlines() if "spawn instead of fork" in line]  # nbaccel's notices go to stdout
    assert len(notices) == 1, run.stdout  # one line, once
    assert notices[0].startswith("nbaccel: CUDA is already initialised in this kernel"), notices


def test_cpu_ranks_on_a_gpu_machine_are_cpu_ranks_for_accelerate_too() -> None:
    pytest.importorskip("accelerate")
    import torch

    from tests.rank.test_accelerate_world import world_seen_by_accelerate

    results = nbaccel.notebook_launcher(world_seen_by_accelerate, args=("PartialState",), num_processes=2, cpu=True)
    assert [(r["type"], r["backend"], r["device"], r["num_processes"]) for r in results] == [("MULTI_CPU", "gloo", "cpu", 2)] * 2
    assert not torch.cuda.is_initialized()
