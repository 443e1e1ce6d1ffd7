"""The fork server in a real ipykernel: forked at %load_ext while fork-safe, used once the kernel is not."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from tests.kernel_harness import Kernel, alive, running_kernel, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

SETUP = """
%load_ext nbaccel
import os, torch
"""
# A second cell: after the first, the server is forked again to share the torch the kernel imported.
MARK = """
from nbaccel.launch.starters import fork_server
from nbaccel.testing import mark_not_fork_safe
server_pid = fork_server.running_server().pid
mark_not_fork_safe("CUDA is already initialised in this kernel (pretend)")
"""


@pytest.fixture(scope="module")
def kernel_env() -> dict[str, str]:
    return {"NBACCEL_OUTPUT": "text", "NBACCEL_FORK_SERVER": "eager"}


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return SETUP


@pytest.fixture(scope="module", autouse=True)
def marked(kernel: Kernel) -> None:
    """The second cell of the module's kernel: note the server, then make the kernel unsafe."""
    assert kernel.execute(MARK).status == "ok"


def server_pid(kernel: Kernel) -> int:
    run = kernel.execute("print(server_pid)")
    return int(run.stdout.strip())


def test_the_server_is_small_and_idle(kernel: Kernel) -> None:
    """First in the module: later cells' garbage collection in the (now unsafe) kernel makes
    shared pages the server's own, which an unsafe kernel cannot undo by forking it again."""
    server = psutil.Process(server_pid(kernel))
    assert server.memory_full_info().uss < 30 * 2**20
    assert server.status() == psutil.STATUS_SLEEPING


def test_a_cell_of_an_unsafe_kernel_runs_on_ranks_of_the_server_with_one_notice(kernel: Kernel) -> None:
    cell = "%%distributed -n 2\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nt = torch.ones(1) * (dist.get_rank() + 1)\ndist.all_reduce(t)\nprint('sum', t.item(), 'parent', os.getppid())"
    run = kernel.execute(cell)
    assert run.status == "ok", run.error
    pid = server_pid(kernel)
    notices = [line for line in run.stdout.splitlines() if "fork server" in line]
    assert len(notices) == 1 and "starting the ranks from nbaccel's fork server (forked from this kernel before it became unsafe)" in notices[0]
    assert sorted(line for line in run.stdout.splitlines() if "sum" in line) == [f"[rank 0] sum 3.0 parent {pid}", f"[rank 1] sum 3.0 parent {pid}"]
    assert [p.pid for p in psutil.Process(kernel.pid).children()] == [pid]  # the ranks were the server's


def test_workers_start_through_the_server(kernel: Kernel) -> None:
    run = kernel.execute("%distributed start -n 2")
    try:
        assert run.status == "ok", run.error
        assert "workers started by forkserver begin with empty namespaces" in run.stdout
        cell = kernel.execute("%%distributed\nimport os\nprint('rank', os.environ['RANK'], 'parent', os.getppid())")
        pid = server_pid(kernel)
        assert sorted(line for line in cell.stdout.splitlines() if "parent" in line) == [f"[rank 0] rank 0 parent {pid}", f"[rank 1] rank 1 parent {pid}"]
    finally:
        assert kernel.execute("%distributed stop").status == "ok"


@pytest.mark.orphans
def test_a_killed_kernel_takes_the_server_and_its_ranks_along() -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text", "NBACCEL_FORK_SERVER": "eager"}) as kernel:
        assert kernel.execute(SETUP).status == "ok"
        assert kernel.execute(MARK).status == "ok"
        run = kernel.execute("%distributed start -n 2")
        assert run.status == "ok", run.error
        pids = [server_pid(kernel)]
        pids += [p.pid for p in psutil.Process(pids[0]).children()]
        assert len(pids) == 3
        os.kill(kernel.pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(pid) for pid in pids), 5, f"server and workers {pids} gone after the kernel's SIGKILL")
