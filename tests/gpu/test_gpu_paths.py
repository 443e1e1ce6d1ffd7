"""GPU tier for issue 14's items 3, 6, 11, 12 (marker ``gpu``; skipped where no CUDA device is visible).

What the CPU tiers decide with stand-ins, on the real thing: a 1-rank NCCL group with DDP (and
READY only once NCCL is up), a real device-side assert ending the workers, and NCCL's flight
recorder naming a rank's last collective. The test process never initialises CUDA (every rank is
forked from it).
"""

from __future__ import annotations

import pytest

import nbaccel
from nbaccel import start_workers

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]


def ddp_on_one_gpu() -> dict:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1).to(state.device))
    model(torch.ones(2, 4, device=state.device)).sum().backward()
    return {
        "backend": dist.get_backend(),
        "world": dist.get_world_size(),
        "type": state.distributed_type.value,
        "grad_device": model.module.weight.grad.device.type,
    }


def test_one_gpu_rank_gets_an_nccl_group_of_one_and_ddp_works() -> None:
    [seen] = nbaccel.notebook_launcher(ddp_on_one_gpu, num_processes=1)
    assert seen == {"backend": "nccl", "world": 1, "type": "MULTI_GPU", "grad_device": "cuda"}


def nccl_is_bound() -> tuple:
    import torch.distributed as dist

    group = dist.group.WORLD
    return str(getattr(group, "bound_device_id", None)), dist.get_backend()


def test_a_pools_ready_means_nccl_is_up() -> None:
    with start_workers(1) as pool:
        assert pool.run(nccl_is_bound) == [("cuda:0", "nccl")]  # device_id= made the communicator at start
        assert pool.run(ddp_on_one_gpu)[0]["backend"] == "nccl"


def device_side_assert() -> None:
    import torch

    index = torch.tensor([5], device="cuda")
    torch.zeros(2, device="cuda")[index].item()  # out of bounds: a device-side assert


def test_a_device_side_assert_ends_the_workers_names_the_rank_and_says_restart(capsys) -> None:
    with start_workers(1) as pool:
        with pytest.raises(nbaccel.RankFailedError, match="device-side assert"):
            pool.run(device_side_assert)
        out = capsys.readouterr().out
        assert "rank 0 hit an unrecoverable CUDA error" in out and "%distributed restart" in out
        assert not pool.alive
        pool.restart()
        assert pool.run(nccl_is_bound)[0][1] == "nccl"


def two_all_reduces_then_wait() -> None:
    import time

    import torch
    import torch.distributed as dist

    value = torch.ones(1, device="cuda")
    dist.all_reduce(value)
    dist.all_reduce(value)
    torch.cuda.synchronize()
    time.sleep(60)


def test_the_flight_recorder_names_the_last_collective_in_the_stack_summary() -> None:
    with start_workers(1) as pool:
        with pytest.raises(nbaccel.LaunchTimeoutError) as caught:
            pool.run(two_all_reduces_then_wait, timeout=8)
        where = caught.value.outcomes[0].where
        assert "time.sleep" in where and "; last collective: nccl:all_reduce #" in where, where
