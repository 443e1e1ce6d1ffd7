"""GPU tier in a real kernel: %%distributed, interrupts of ranks blocked on the GPU, %distributed status.

Marker ``gpu``: skipped where no CUDA device is visible. The kernel must stay free of CUDA for
the whole module (every cell forks from it), which each test checks at its end.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.kernel_harness import Execution, Kernel, running_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.kernel, pytest.mark.timeout(300)]

INTERRUPT_WITHIN_S = 5.0


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


needs_two_gpus = pytest.mark.skipif("gpu_count() < 2", reason="needs two CUDA GPUs")

DEFINE = """
%load_ext nbaccel
import os, time, torch, nbaccel
"""


@pytest.fixture(scope="module")
def kernel() -> Iterator[Kernel]:
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as k:
        assert k.execute(DEFINE).status == "ok"
        yield k


def ok(kernel: Kernel, code: str, **kwargs: float) -> Execution:
    run = kernel.execute(code, **kwargs)
    assert run.status == "ok", (run.error, run.stdout[-2000:], run.stderr[-2000:])
    return run


def kernel_has_no_cuda(kernel: Kernel) -> bool:
    return ok(kernel, "print(torch.cuda.is_initialized())").stdout.strip() == "False"


def test_each_rank_uses_the_gpu_of_its_local_rank_and_its_tensors_come_back_on_the_cpu(kernel: Kernel) -> None:
    n = gpu_count()
    ok(
        kernel,
        "%%distributed -o placed\nt = torch.full((2,), float(state.process_index), device=state.device)\n(torch.cuda.current_device(), str(state.device), t)",
    )
    run = ok(kernel, "print([(c, d, t.device.type, t.tolist()) for c, d, t in placed])")
    assert run.stdout.strip() == str([(i, f"cuda:{i}", "cpu", [float(i)] * 2) for i in range(n)])
    assert kernel_has_no_cuda(kernel)


def test_gpus_option_picks_the_device(kernel: Kernel) -> None:
    last = gpu_count() - 1
    ok(kernel, f"%%distributed --gpus {last} -o where\n(torch.cuda.current_device(), os.environ['CUDA_VISIBLE_DEVICES'], torch.cuda.device_count())")
    assert ok(kernel, "print(where)").stdout.strip() == str([(0, str(last), 1)])
    assert kernel_has_no_cuda(kernel)


def interrupted(kernel: Kernel, code: str, ready_after: float) -> tuple[Execution, float]:
    """Run ``code``, interrupt it after ``ready_after`` s; the execution and the seconds it took to stop."""
    run = kernel.execute(code, timeout=120, interrupt_after=ready_after)
    return run, run.elapsed - ready_after


BLOCKED_IN_CUDA = """
%%distributed -n 1
print("spinning", flush=True)
torch.cuda._sleep(2**62)  # a GPU kernel that spins for hours; synchronize() waits for it in native code
torch.cuda.synchronize()
"""


def test_a_rank_blocked_in_a_cuda_wait_is_interrupted_within_5_s(kernel: Kernel) -> None:
    run, took = interrupted(kernel, BLOCKED_IN_CUDA, ready_after=8.0)
    assert run.status == "error" and run.error["ename"] == "KeyboardInterrupt", run.error
    assert "spinning" in run.stdout
    assert took < INTERRUPT_WITHIN_S, f"took {took:.1f} s to stop"
    assert kernel.children() == []
    assert kernel_has_no_cuda(kernel)


BLOCKED_IN_NCCL = """
%%distributed -n 2
import torch.distributed as dist
t = torch.ones(1, device=state.device)
dist.all_reduce(t); torch.cuda.synchronize()  # the communicator is up on both ranks
print("ready", flush=True)
if state.process_index == 0:
    dist.all_reduce(t)  # rank 1 never joins
    torch.cuda.synchronize()
else:
    time.sleep(120)
"""


@needs_two_gpus
def test_a_rank_blocked_in_an_nccl_collective_is_interrupted_within_5_s(kernel: Kernel) -> None:
    run, took = interrupted(kernel, BLOCKED_IN_NCCL, ready_after=12.0)
    assert run.status == "error" and run.error["ename"] == "KeyboardInterrupt", run.error
    assert run.stdout.count("ready") == 2, run.stdout
    assert took < INTERRUPT_WITHIN_S, f"took {took:.1f} s to stop"
    assert kernel.children() == []
    assert kernel_has_no_cuda(kernel)


def test_distributed_status_shows_each_rank_gpu_memory(kernel: Kernel) -> None:
    n = gpu_count()
    ok(kernel, "%distributed start")
    try:
        ok(kernel, "%%distributed\nblock = torch.empty(256 * 2**20, dtype=torch.uint8, device=state.device)")
        lines = ok(kernel, "%distributed status").shown.splitlines()
        assert lines[0].split()[:4] == ["rank", "pid", "device", "state"], lines
        rows = lines[1:]
        assert len(rows) == n, lines
        for rank, row in enumerate(rows):
            assert row.split()[2] == f"cuda:{rank}", row
            assert "256 MiB / " in row, row  # allocated / reserved by torch / the device's use
        ok(kernel, "%%distributed\ndel block")
        freed = ok(kernel, "%distributed free").stdout.splitlines()
        for row in freed[1:]:
            assert "(-256 MiB)" in row, freed  # torch's cache handed back to the device
    finally:
        kernel.execute("%distributed stop")
    assert kernel.children() == []
    assert kernel_has_no_cuda(kernel)


def test_a_profiled_cell_on_gpus_records_cuda_kernels(kernel: Kernel, tmp_path: Path) -> None:
    import json

    ok(
        kernel,
        f"%%distributed --profile {tmp_path}\nimport torch, torch.distributed as dist\nx = torch.randn(1024, 1024, device=state.device)\nfor _ in range(10):\n    x = x @ x\n    dist.all_reduce(x)\ntorch.cuda.synchronize()",
    )
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"]), "no CUDA kernel in the merged trace"
    assert kernel_has_no_cuda(kernel)
