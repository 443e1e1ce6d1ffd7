"""A real kernel's state before a launch, as a GPU notebook leaves it (issue 14, items 1 and 16).

No GPU here: ``torch.cuda.is_available()`` runs on a CPU torch, so only the env default and the
decision are checked; the driver's side is a fake ``libcuda.so.1`` loaded into the kernel (what
torch does) whose ``cuInit`` the kernel then runs, as ``is_available()`` would without NVML.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.devices.fakes import build_fake_cuda
from tests.kernel_harness import Kernel, running_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

SETUP = """
import ctypes, os, torch, nbaccel
from nbaccel.launch.preflight import fork_hazards
from nbaccel.launch.plan import choose_starter

def rank_work():
    torch.set_num_threads(2)
    return float((torch.ones(2**22) * 2).sum())
"""


def test_is_available_leaves_the_kernel_fork_safe(kernel: Kernel) -> None:
    run = kernel.execute(
        "import nbaccel, os, torch\ntorch.cuda.is_available()\nprint(os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'])\nfrom nbaccel.launch.preflight import fork_hazards\nfrom nbaccel.launch.plan import choose_starter\nprint([h.kind for h in fork_hazards()], type(choose_starter('auto', 2)).__name__)"
    )
    assert run.status == "ok", run.error
    assert run.stdout.splitlines() == ["1", "[] ForkStarter"]


def test_a_launch_after_the_kernel_used_openmp_does_not_hang(kernel: Kernel) -> None:
    assert kernel.execute(SETUP).status == "ok"
    run = kernel.execute(
        "torch.set_num_threads(2); x = torch.ones(2**22); x.sum()\nnbaccel.notebook_launcher(rank_work, num_processes=1, timeout=60)", timeout=120
    )
    assert run.status == "ok", (run.error, run.stdout, run.stderr)
    [result] = run.of_type("execute_result")
    assert result["content"]["data"]["text/plain"] == f"[{2.0 * 2**22}]"
    assert "torch.set_num_threads(2) kept at 1" in run.stdout + run.stderr
    assert kernel.children() == []


@pytest.fixture
def poisoned_kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    fake = build_fake_cuda(tmp_path_factory.mktemp("fake-cuda"))
    with running_kernel(
        env={
            "NBACCEL_OUTPUT": "text",
            "NBACCEL_CUDA_DRIVER_LIBRARY": str(fake),
            "FAKE_CUDA_DEVICES": "0",
            "NBACCEL_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1",
        }
    ) as kernel:
        assert kernel.execute(SETUP).status == "ok"
        yield kernel


def test_a_kernel_that_ran_cuinit_starts_its_ranks_from_the_fork_server_or_refuses_to_fork(poisoned_kernel: Kernel) -> None:
    run = poisoned_kernel.execute("ctypes.CDLL(os.environ['NBACCEL_CUDA_DRIVER_LIBRARY']).cuInit(0)\nprint([h.kind for h in fork_hazards()])")
    assert run.stdout.strip() == "['cuda']"
    run = poisoned_kernel.execute("nbaccel.notebook_launcher(lambda: int(os.environ['RANK']), num_processes=2, timeout=90)", timeout=150)
    assert run.status == "ok", (run.error, run.stdout, run.stderr)
    # The kernel harness keeps the server lazy, so it is started fresh now (the kernel is no longer fork-safe).
    assert "nbaccel: CUDA is already initialised in this kernel" in run.stdout and "from nbaccel's fork server" in run.stdout
    assert run.of_type("execute_result")[0]["content"]["data"]["text/plain"] == "[0, 1]"
    refused = poisoned_kernel.execute("nbaccel.notebook_launcher(lambda: 1, num_processes=2, start_method='fork')")
    assert refused.error is not None and refused.error["ename"] == "PreflightError"
