"""In a real ipykernel, the fork server and a cell's ranks say what they are in ps, top and nvidia-smi.

Imports internals (rank.process_title): its ``command_line`` reads /proc as ps does.
"""

from __future__ import annotations

import pytest

from nbaccel.rank.process_title import command_line
from tests.kernel_harness import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

NAMES = "import os\nprint(open(f'/proc/{os.getpid()}/comm').read().strip(), open(f'/proc/{os.getpid()}/cmdline', 'rb').read().rstrip(b'\\0').decode(), sep='|')"


@pytest.fixture(scope="module")
def kernel_env() -> dict[str, str]:
    return {"NBACCEL_OUTPUT": "text", "NBACCEL_FORK_SERVER": "eager"}


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    # What a launch imports in the kernel, first: the server is forked again after this cell to
    # share them, not while a test runs (the leak check would count the new one).
    return "%load_ext nbaccel\nimport numpy, torch, torch.distributed"


def test_a_cells_ranks_are_named_by_rank_and_cell(kernel: Kernel) -> None:
    run = kernel.execute(f"%%distributed -n 2\n{NAMES}")
    assert run.status == "ok", run.error
    number = run.reply["content"]["execution_count"]
    named = sorted(line for line in run.stdout.splitlines() if line.startswith("[rank"))
    assert named == [f"[rank {r}] nbaccel-r{r}/2|nbaccel rank {r}/2 (cell [{number}])" for r in range(2)]


def test_the_fork_server_is_named_with_its_kernel_and_the_kernel_keeps_its_name(kernel: Kernel) -> None:
    run = kernel.execute("from nbaccel.launch import fork_server\nprint(fork_server.running_server().pid)")
    assert run.status == "ok", run.error
    server = int(run.stdout.strip())
    with open(f"/proc/{server}/comm") as comm:
        assert comm.read().strip() == "nbaccel-forksrv"
    assert command_line(server) == f"nbaccel fork server (kernel {kernel.pid})"
    assert "ipykernel" in command_line(kernel.pid)


def test_workers_are_named_workers(kernel: Kernel) -> None:
    assert kernel.execute("%distributed start -n 2").status == "ok"
    try:
        run = kernel.execute(f"%%distributed\n{NAMES}")
        assert run.status == "ok", run.error
        named = sorted(line for line in run.stdout.splitlines() if line.startswith("[rank"))
        assert named == [f"[rank {r}] nbaccel-w{r}/2|nbaccel worker {r}/2" for r in range(2)]
    finally:
        assert kernel.execute("%distributed stop").status == "ok"
