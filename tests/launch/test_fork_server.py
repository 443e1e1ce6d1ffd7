"""The fork server: ranks forked from it when the kernel is not fork-safe, exits relayed, no orphan.

Imports internals (launch): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import psutil
import pytest

import nbaccel
from nbaccel import RankFailedError
from nbaccel.launch import fork_server, spawn
from nbaccel.testing import mark_fork_safe, mark_not_fork_safe, scaled
from tests.kernel_harness import alive, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def unsafe_kernel() -> Iterator[fork_server.ForkServer]:
    """This process with a server forked while it was fork-safe, then marked unsafe."""
    fork_server.start_early()  # does nothing once this process's OpenMP pool started (then: exec'd)
    server = fork_server.running_server() or fork_server.fork_server()
    mark_not_fork_safe("CUDA is initialised (pretend)")
    try:
        yield server
    finally:
        mark_fork_safe()
        fork_server.shutdown()


def all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    return value.item()


def test_an_unsafe_kernel_launches_through_the_server_with_a_one_line_notice(unsafe_kernel, capsys) -> None:
    offset = 10
    results = nbaccel.notebook_launcher(lambda: (int(os.environ["RANK"]) + offset, os.getppid()), num_processes=2)
    assert [r[0] for r in results] == [10, 11]
    assert {r[1] for r in results} == {unsafe_kernel.pid}  # the server's children, not the kernel's
    notices = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel:")]
    how = "forked from this kernel before it became unsafe" if unsafe_kernel.how == "forked" else "a fresh interpreter; its first launch imports torch"
    assert notices == [f"nbaccel: CUDA is initialised (pretend); starting the ranks from nbaccel's fork server ({how})."]
    assert nbaccel.notebook_launcher(all_reduce_rank, num_processes=2) == [3.0, 3.0]


def test_exit_codes_and_signals_are_relayed(unsafe_kernel) -> None:
    with pytest.raises(RankFailedError, match="exit code 3|exited with 3|code 3"):
        nbaccel.notebook_launcher(lambda: os._exit(3), num_processes=1)
    with pytest.raises(RankFailedError, match="ZeroDivisionError"):
        nbaccel.notebook_launcher(lambda: 1 / 0, num_processes=2)
    with pytest.raises(RankFailedError, match="SIGKILL|signal 9|killed"):
        nbaccel.notebook_launcher(lambda: os.kill(os.getpid(), signal.SIGKILL), num_processes=1)
    assert nbaccel.notebook_launcher(lambda: "still serving", num_processes=1) == ["still serving"]


@pytest.mark.slow
def test_a_dead_server_is_restarted_and_says_so(unsafe_kernel, capsys) -> None:
    os.kill(unsafe_kernel.pid, signal.SIGKILL)
    wait_until(lambda: not alive(unsafe_kernel.pid), 5, "server killed")
    assert nbaccel.notebook_launcher(lambda: 7, num_processes=2) == [7, 7]
    out = capsys.readouterr().out
    assert "the fork server had ended; started a new one" in out
    restarted = fork_server.running_server()
    assert restarted is not None and restarted.pid != unsafe_kernel.pid


def test_start_method_forkserver_is_honoured_and_pools_use_it() -> None:
    fork_server.start_early()
    try:
        ppid = nbaccel.notebook_launcher(lambda: os.getppid(), num_processes=1, start_method="forkserver")
        assert ppid == [fork_server.running_server().pid]
        pool = nbaccel.start_workers(num_processes=2, start_method="forkserver")
        try:
            assert pool.start_method == "forkserver"
            assert pool.run(lambda: os.environ["RANK"]) == ["0", "1"]
        finally:
            pool.stop()
    finally:
        fork_server.shutdown()


def test_the_job_is_pickled_once_per_launch(unsafe_kernel, monkeypatch) -> None:
    calls = []
    real = spawn.dump_job
    monkeypatch.setattr(spawn, "dump_job", lambda job, *rest: calls.append(1) or real(job, *rest))
    assert nbaccel.notebook_launcher(lambda: 1, num_processes=3) == [1, 1, 1]
    assert len(calls) == 1


KILLED_KERNEL = textwrap.dedent(
    """
    import os, sys, time
    from nbaccel.launch import fork_server
    from nbaccel.testing import mark_not_fork_safe
    import nbaccel
    fork_server.start_early()
    mark_not_fork_safe("pretend")
    def rank():
        print("RANK_PID", os.getpid(), flush=True)
        time.sleep(600)
    print("SERVER_PID", fork_server.running_server().pid, flush=True)
    nbaccel.notebook_launcher(rank, num_processes=2)
    """
)


@pytest.mark.slow
@pytest.mark.orphans
def test_a_killed_kernel_leaves_no_orphan() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "NBACCEL_OUTPUT": "text"}
    kernel = subprocess.Popen([sys.executable, "-c", KILLED_KERNEL], stdout=subprocess.PIPE, text=True, env=env)
    pids: list[int] = []
    try:
        while len(pids) < 3:
            line = kernel.stdout.readline()  # type: ignore[union-attr]
            assert line, "the kernel ended before its ranks started"
            if "_PID" in line:
                pids.append(int(line.split()[-1]))
        kernel.kill()
        kernel.wait()
        wait_until(lambda: not any(alive(pid) for pid in pids), 5, f"server and ranks {pids} gone after the kernel's SIGKILL")
    finally:
        kernel.kill()
        kernel.wait()
        kernel.stdout.close()  # type: ignore[union-attr]
        for pid in pids:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


@pytest.mark.slow
def test_an_idle_server_uses_no_cpu_and_little_memory(unsafe_kernel) -> None:
    if unsafe_kernel.how != "forked":
        pytest.skip("this test process ran multi-threaded torch ops before: its server was exec'd (the kernel tier checks the forked one)")
    process = psutil.Process(unsafe_kernel.pid)
    before = process.cpu_times()
    import time

    time.sleep(scaled(0.5))
    after = process.cpu_times()
    assert after.user + after.system - before.user - before.system < 0.02
    assert process.memory_full_info().uss < 30 * 2**20


def fail_while_the_peer_waits_in_all_reduce() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("rank 1 gives up")
    dist.all_reduce(torch.ones(1))


def test_a_peers_stack_is_in_the_report_though_the_ranks_are_the_servers_children(unsafe_kernel) -> None:
    with pytest.raises(RankFailedError, match="rank 1 failed: ValueError: rank 1 gives up") as caught:
        nbaccel.notebook_launcher(fail_while_the_peer_waits_in_all_reduce, num_processes=2)
    assert "rank 0: in `dist.all_reduce`" in str(caught.value)  # asked of /proc: waitid knows only our own children
