"""After a task that failed or was stopped, the pool says the right error and is kept only if it can go on.

Real workers on gloo: a peer failing while a rank is blocked in native code that SIGINT cannot
interrupt (issue 14, item 4), ranks left at different collective counts (item 5), and a rank
whose CUDA context died (item 6, with an exception that reads like CUDA's: no GPU here).

Imports nbaccel.pool.policies and rank.serve (internal): the tests read the keep-or-drop policy and make a rank's teardown hang.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

import nbaccel
import nbaccel.pool.policies as policies
from nbaccel import PoolStoppedError, start_workers
from tests.handshake import mark, wait_for, wait_until_blocked

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pool():
    with start_workers(2) as workers:
        yield workers


def all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    return value.item()


def block_in_c_on_rank_zero_while_rank_one_fails(marker: str) -> None:
    import ctypes

    if os.environ["RANK"] == "1":
        wait_until_blocked(marker)  # rank 0 is in its C call
        raise ValueError("rank 1's own failure")
    # A C call that no signal nbaccel sends before SIGKILL can end: SIGINT (and the stack
    # request, which would end sleep() early) are blocked in this thread, as in a CUDA sync.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGUSR2})
    mark(marker)
    ctypes.CDLL(None).sleep(60)


def test_a_peer_failure_while_a_rank_is_stuck_in_native_code_raises_the_failure(pool, monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setattr(policies, "INTERRUPT_GRACE", 1.0)
    started = time.monotonic()
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: rank 1's own failure") as caught:
        pool.run(block_in_c_on_rank_zero_while_rank_one_fails, str(tmp_path / "in-c"))
    assert not isinstance(caught.value, KeyboardInterrupt)
    assert time.monotonic() - started < 10
    assert "rank(s) 0 did not stop within 1 s" in capsys.readouterr().out
    assert not pool.alive and psutil.Process().children() == []
    with pytest.raises(PoolStoppedError):
        pool.run(int)


def _interrupt_once(*markers: str) -> threading.Thread:
    """SIGINT this process (as the stop button does) once every marker exists."""

    def wait_then_interrupt() -> None:
        wait_for(*markers)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=wait_then_interrupt, name="interrupt-once-marked")
    thread.start()
    return thread


def one_more_collective_on_rank_zero(folder: str) -> None:
    import torch
    import torch.distributed as dist

    if os.environ["RANK"] == "0":
        dist.all_reduce(torch.ones(1), async_op=True)  # issued; its partner never comes
    mark(os.path.join(folder, os.environ["RANK"]))
    time.sleep(30)


def test_an_interrupt_that_leaves_ranks_out_of_step_stops_the_pool_and_says_why(pool, capsys, tmp_path) -> None:
    assert pool.run(all_reduce_rank) == [3.0, 3.0]  # both ranks at the same count first
    interrupter = _interrupt_once(str(tmp_path / "0"), str(tmp_path / "1"))
    with pytest.raises(KeyboardInterrupt):
        pool.run(one_more_collective_on_rank_zero, str(tmp_path))
    interrupter.join()
    out = capsys.readouterr().out
    assert "the ranks issued different numbers of collectives (rank 0: 2, rank 1: 1)" in out
    assert "the workers were stopped" in out
    assert not pool.alive and psutil.Process().children() == []


def fail_on_rank_one_after_rank_zero_issued_one_more(marker: str) -> None:
    import torch
    import torch.distributed as dist

    if os.environ["RANK"] == "1":
        wait_for(marker)  # rank 0 issued its collective
        raise ValueError("bad cell")
    dist.all_reduce(torch.ones(1), async_op=True)
    mark(marker)
    time.sleep(30)


def test_a_failure_that_leaves_ranks_out_of_step_raises_it_and_stops_the_pool(pool, capsys, tmp_path) -> None:
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: bad cell"):
        pool.run(fail_on_rank_one_after_rank_zero_issued_one_more, str(tmp_path / "issued"))
    assert "(rank 0: 1, rank 1: 0)" in capsys.readouterr().out
    assert not pool.alive


def test_ranks_in_step_after_a_failure_keep_the_pool(pool, capsys) -> None:
    def fail_after_a_collective_on_both() -> None:
        all_reduce_rank()
        if os.environ["RANK"] == "1":
            raise ValueError("bad cell")
        time.sleep(30)

    pids = [s.pid for s in pool.status()]
    with pytest.raises(nbaccel.RankFailedError):
        pool.run(fail_after_a_collective_on_both)
    assert "collectives" not in capsys.readouterr().out
    assert [s.pid for s in pool.status()] == pids
    assert pool.run(all_reduce_rank) == [3.0, 3.0]


def raise_a_device_side_assert_on_rank_one() -> None:
    import torch

    if os.environ["RANK"] == "1":
        # What torch raises after a failed device assert (torch.AcceleratorError, torch >= 2.8).
        raise torch.AcceleratorError(
            "CUDA error: device-side assert triggered\nCUDA kernel errors might be asynchronously "
            "reported at some other API call, so the stacktrace below might be incorrect."
        )
    time.sleep(30)


def test_an_unrecoverable_cuda_error_ends_the_workers_names_rank_and_error(pool, capsys) -> None:
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: AcceleratorError: CUDA error: device-side assert"):
        pool.run(raise_a_device_side_assert_on_rank_one)
    out = capsys.readouterr().out
    assert "rank 1 hit an unrecoverable CUDA error (CUDA error: device-side assert triggered)" in out
    assert "%distributed restart" in out
    assert not pool.alive and psutil.Process().children() == []
    pool.restart()  # the same options, fresh processes
    assert pool.run(all_reduce_rank) == [3.0, 3.0]


def test_an_ordinary_error_that_mentions_cuda_keeps_the_pool(pool) -> None:
    def out_of_memory() -> None:
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    with pytest.raises(nbaccel.RankFailedError):
        pool.run(out_of_memory)
    assert pool.alive and pool.run(all_reduce_rank) == [3.0, 3.0]


def ddp_step() -> tuple:
    import torch
    import torch.nn as nn

    model = nn.parallel.DistributedDataParallel(nn.Linear(2, 1))
    model(torch.ones(3, 2)).sum().backward()
    return tuple(model.module.weight.grad.shape)


def test_one_worker_has_a_process_group_of_one_so_ddp_works() -> None:
    with start_workers(1) as one:
        assert one.run(ddp_step) == [(1, 2)]
        assert one.run(all_reduce_rank) == [1.0]


def hang_in_teardown_on_rank_one() -> None:
    import torch.distributed as dist

    import nbaccel.rank.serve

    if dist.get_rank() == 1:  # serve() leaves the group through this on STOP
        nbaccel.rank.serve._destroy_default_group = lambda: time.sleep(600)


@pytest.mark.slow
def test_a_worker_stuck_leaving_its_group_on_stop_is_killed_and_named(capsys, monkeypatch) -> None:
    # The stop waits 2 s plus the ranks' exit-handler bound: a short bound keeps the test short.
    monkeypatch.setenv("NBACCEL_EXIT_TIMEOUT", "1")
    pool = start_workers(2)
    try:
        pool.run(hang_in_teardown_on_rank_one)
    finally:
        started = time.monotonic()
        pool.stop()
    assert time.monotonic() - started < 6
    assert "rank(s) 1 did not leave the process group within 3 s of the stop" in capsys.readouterr().out
    assert psutil.Process().children() == []
