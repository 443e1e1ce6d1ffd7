"""GPU tier: a kernel with CUDA initialised launches one rank per GPU through the fork server, on NCCL.

Marker ``gpu``: skipped where no CUDA device is visible.
"""

from __future__ import annotations

import pytest

from tests.kernel_harness import running_kernel

pytestmark = [pytest.mark.gpu, pytest.mark.kernel, pytest.mark.timeout(300)]

SETUP = """
%load_ext nbaccel
import os, torch, nbaccel
from nbaccel.launch.starters import fork_server
server_pid = fork_server.running_server().pid  # forked at %load_ext, before CUDA
captured = torch.arange(4.0, device="cuda")  # CUDA is initialised in the kernel from here on
assert torch.cuda.is_initialized()

def nccl_rank():
    import torch.distributed as dist
    dist.init_process_group("nccl")
    local = int(os.environ["LOCAL_RANK"])
    t = torch.ones(1, device=f"cuda:{local}") * (dist.get_rank() + 1)
    dist.all_reduce(t)
    return t.item(), str(captured.device), captured.sum().item(), os.getppid()
"""


def test_a_kernel_that_touched_cuda_launches_one_rank_per_gpu_through_the_server_on_nccl() -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text", "NBACCEL_FORK_SERVER": "eager"}) as kernel:
        assert kernel.execute(SETUP).status == "ok"
        run = kernel.execute("results = nbaccel.notebook_launcher(nccl_rank); print('RESULTS', results, server_pid, torch.cuda.device_count())")
        assert run.status == "ok", (run.error, run.stdout)
        assert "starting the ranks from nbaccel's fork server (forked from this kernel before it became unsafe)" in run.stdout
        assert "the function holds 1 CUDA tensor(s)" in run.stdout
        line = next(line for line in run.stdout.splitlines() if line.startswith("RESULTS"))
        results, server_pid, gpus = eval(line[len("RESULTS") :].rsplit(" ", 2)[0]), int(line.split()[-2]), int(line.split()[-1])
        n = gpus
        assert [r[0] for r in results] == [n * (n + 1) / 2] * n
        assert [r[1] for r in results] == [f"cuda:{i}" for i in range(n)]  # each rank's own GPU, not cuda:0
        assert {r[2] for r in results} == {6.0}
        assert {r[3] for r in results} == {server_pid}
