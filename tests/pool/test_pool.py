"""Persistent workers through the Python API: state across calls, failures, interrupts, teardown.

Imports internals (launch.local, launch.options, launch.plan, output.sinks, pool.pool, pool.policies): it tests those units directly, below the public face.
"""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import psutil
import pytest

import nbaccel
import nbaccel.pool.policies as policies
from nbaccel import PoolStoppedError, start_workers
from tests.handshake import InterruptOnceAllSay

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def pool():
    with start_workers(2) as workers:
        yield workers


class Remember:
    """A task over the rank's namespace: stores the rank, returns what was there."""

    def __call__(self, namespace: dict) -> object:
        before = namespace.get("seen")
        namespace["seen"] = int(os.environ["RANK"])
        return before


def all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist

    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    return value.item()


def test_start_returns_ready_ranks_with_a_process_group(pool) -> None:
    assert pool.devices == ["cpu", "cpu"]
    assert pool.run(all_reduce_rank) == [3.0, 3.0]


def test_start_is_fast_and_reaps_everything_on_stop() -> None:
    started = time.monotonic()
    workers = start_workers(4)
    took = time.monotonic() - started
    pids = [s.pid for s in workers.status()]
    workers.stop()
    assert took < 5.0  # the benchmark measures it properly; here only a bound
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    assert psutil.Process().children() == []


def test_namespaces_persist_between_calls(pool) -> None:
    assert pool.run_task(Remember()) == [None, None]
    assert pool.run_task(Remember()) == [0, 1]


def test_push_and_pull(pool) -> None:
    import torch

    pool.push(weights=torch.arange(3.0), scale=2)
    assert pool.run_task(lambda ns: ns["scale"] * int(os.environ["RANK"])) == [0, 2]
    pool.run_task(lambda ns: ns.__setitem__("weights", ns["weights"] * (1 + int(os.environ["RANK"]))))
    assert pool.pull("weights", rank=1).tolist() == [0.0, 2.0, 4.0]
    assert pool.pull("weights").tolist() == [0.0, 1.0, 2.0]
    model = torch.nn.Linear(2, 1)
    pool.push(model=model)
    assert set(pool.pull("model")) == {"weight", "bias"}  # a module comes back as its state_dict
    with pytest.raises(nbaccel.RankFailedError, match="NameError: name 'missing' is not defined on this rank"):
        pool.pull("missing")


def test_pushing_an_unpicklable_object_names_it(pool) -> None:
    with pytest.raises(TypeError, match="cannot push 'lock': a lock cannot be pickled"):
        pool.push(ok=1, lock=threading.Lock())


def test_selected_ranks_and_bad_ranks(pool) -> None:
    assert pool.run(lambda: int(os.environ["RANK"]) * 10, ranks=[1]) == {1: 10}
    with pytest.raises(ValueError, match=r"ranks \[2\] are not all in this pool of 2 ranks"):
        pool.run(int, ranks=[2])


def fail_on_rank_one_while_rank_zero_sleeps() -> None:
    if os.environ["RANK"] == "1":
        raise ValueError("bad cell")
    time.sleep(20)


def test_a_raising_rank_fails_the_call_but_keeps_the_pool(pool) -> None:
    pids = [s.pid for s in pool.status()]
    started = time.monotonic()
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: bad cell") as caught:
        pool.run(fail_on_rank_one_while_rank_zero_sleeps)
    assert time.monotonic() - started < 5
    assert [o.status.value for o in caught.value.outcomes] == ["stopped", "failed"]
    assert [s.pid for s in pool.status()] == pids
    assert pool.run(all_reduce_rank) == [3.0, 3.0]


def sleep_long() -> None:
    print("sleeping", flush=True)
    time.sleep(30)


def test_interrupt_stops_the_cell_on_every_rank_and_keeps_workers_and_namespaces(pool) -> None:
    pool.run_task(Remember())
    pids = [s.pid for s in pool.status()]
    sink = InterruptOnceAllSay("sleeping")
    with pytest.raises(KeyboardInterrupt):
        pool.run(sleep_long, output=sink)
    assert sink.sent_at is not None and time.monotonic() - sink.sent_at < 2.5
    assert [s.pid for s in pool.status()] == pids
    assert pool.run_task(Remember()) == [0, 1]
    assert pool.run(all_reduce_rank) == [3.0, 3.0]


def ignore_interrupts() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stand-in for a rank stuck in native code
    print("ignoring SIGINT", flush=True)
    time.sleep(30)


@pytest.mark.slow
def test_a_rank_that_does_not_stop_tears_the_pool_down_and_says_so(pool, monkeypatch, capsys) -> None:
    monkeypatch.setattr(policies, "INTERRUPT_GRACE", 1.0)
    with pytest.raises(KeyboardInterrupt, match=r"rank\(s\) 0, 1 did not stop within 1 s"):
        pool.run(ignore_interrupts, output=InterruptOnceAllSay("ignoring SIGINT"))
    assert "the workers were stopped" in capsys.readouterr().out
    assert not pool.alive and psutil.Process().children() == []
    with pytest.raises(PoolStoppedError):
        pool.run(int)
    with start_workers(2) as again:
        assert again.run(all_reduce_rank) == [3.0, 3.0]


def crash_rank_one() -> None:
    if os.environ["RANK"] == "1":
        print("rank 1 going down", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def test_a_crashing_rank_is_detected_reported_and_the_pool_stopped(pool) -> None:
    started = time.monotonic()
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: killed by SIGKILL") as caught:
        pool.run(crash_rank_one)
    assert time.monotonic() - started < 1.5
    assert [o.describe() for o in caught.value.outcomes] == ["rank 0: stopped", "rank 1: killed by SIGKILL"]
    assert "rank 1 going down" in caught.value.last_lines
    assert not pool.alive and psutil.Process().children() == []


@pytest.mark.slow
def test_a_worker_that_died_while_idle_is_named_at_the_next_call(pool) -> None:
    victim = pool.status()[1].pid
    os.kill(victim, signal.SIGKILL)
    _wait_until_reapable(victim)  # dead, not yet reaped: the pool reaps its own ranks
    with pytest.raises(PoolStoppedError, match=r"rank 1: killed by SIGKILL"):
        pool.run(int)
    assert psutil.Process().children() == []


def _wait_until_reapable(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of ``pid`` is gone (a zombie leader with live threads cannot be reaped yet)."""
    deadline = time.monotonic() + timeout
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"process {pid} did not die"
        time.sleep(0.01)


def destroy_in_every_way() -> None:
    import torch.distributed as dist

    dist.destroy_process_group()  # as DDP scripts end
    nbaccel.PartialState().destroy_process_group()
    dist.destroy_process_group()


def test_destroy_process_group_in_a_cell_does_not_break_the_pool(pool, capfd) -> None:
    pool.run(destroy_in_every_way)
    assert pool.run(all_reduce_rank) == [3.0, 3.0]
    err = capfd.readouterr().err
    assert err.count("destroy_process_group() is deferred until the workers stop") == 2  # once per rank


def test_timeout_interrupts_the_call_and_keeps_the_pool(pool) -> None:
    def report_then_sleep() -> None:
        print("in the long part", flush=True)
        time.sleep(30)

    with pytest.raises(nbaccel.LaunchTimeoutError, match="rank 0: last output: 'in the long part'"):
        pool.run(report_then_sleep, timeout=1.0)
    assert pool.run(all_reduce_rank) == [3.0, 3.0]


def test_restart_gives_fresh_processes_and_empty_namespaces(pool) -> None:
    pool.run_task(Remember())
    pids = [s.pid for s in pool.status()]
    pool.restart()
    assert not set(pids) & {s.pid for s in pool.status()}
    assert pool.run_task(Remember()) == [None, None]


def test_status_reports_every_rank(pool) -> None:
    pool.run(all_reduce_rank)
    pool.push(unrelated=1)  # moving variables is not running a cell
    statuses = pool.status()
    assert [s.rank for s in statuses] == [0, 1]
    assert all(s.state == "idle" and s.device == "cpu" and s.memory_mb > 0 for s in statuses)
    assert statuses[0].last_cell == "all_reduce_rank"
    assert "rank 0: pid" in statuses[0].describe()


@pytest.mark.slow
def test_spawned_workers_work_too() -> None:
    with start_workers(2, start_method="spawn") as spawned:
        assert spawned.run(all_reduce_rank) == [3.0, 3.0]
        offset = 5
        assert spawned.run(lambda: offset + int(os.environ["RANK"])) == [5, 6]


@pytest.mark.slow
def test_interrupts_that_arrive_between_tasks_never_break_the_workers(pool) -> None:
    # Every rank fails at once, so the kernel interrupts peers that may have answered already:
    # that late SIGINT must be dropped by an idle worker, whatever it was doing.
    def everyone_fails() -> None:
        raise RuntimeError(f"rank {os.environ['RANK']}")

    for _ in range(100):
        with pytest.raises(nbaccel.RankFailedError):
            pool.run(everyone_fails)
    assert pool.alive and pool.run(all_reduce_rank) == [3.0, 3.0]


class _FlushCounter(io.StringIO):
    def __init__(self) -> None:
        super().__init__()
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1
        super().flush()


def test_start_runs_the_sink_lifecycle_around_start_up_output(monkeypatch) -> None:
    """What ranks print while the pool starts reaches a sink between launch_started and launch_finished (a text sink flushes there)."""
    import nbaccel.pool.pool as pool_module
    from nbaccel.launch.local import LocalGroupStarter
    from nbaccel.launch.options import LaunchOptions
    from nbaccel.launch.plan import choose_starter, make_plan
    from nbaccel.output.sinks import TextSink

    serve = pool_module.serve

    def noisy_serve(*args, **kwargs):  # runs in each forked rank, before it says READY
        print("warming up", flush=True)
        return serve(*args, **kwargs)

    monkeypatch.setattr(pool_module, "serve", noisy_serve)
    calls: list[object] = []

    class Recording(TextSink):
        def launch_started(self, num_processes, attempt, ranks=None) -> None:
            calls.append(("started", num_processes, attempt))

        def output(self, rank, stream, lines) -> None:
            calls.append("output")
            super().output(rank, stream, lines)

        def launch_finished(self, outcomes) -> None:
            calls.append(("finished", len(outcomes)))
            super().launch_finished(outcomes)

    stdout = _FlushCounter()
    plan = make_plan(LaunchOptions(num_processes=2, cpu=True, start_method="fork"), time.monotonic())
    workers = pool_module.WorkerPool(plan, LocalGroupStarter(choose_starter("fork")), None, 60.0).start(output=Recording(stdout=stdout))
    try:
        assert workers.run(lambda: 1) == [1, 1]
    finally:
        workers.stop()
    assert calls == [("started", 2, 0), "output", "output", ("finished", 2)]
    assert sorted(stdout.getvalue().splitlines()) == ["[rank 0] warming up", "[rank 1] warming up"]
    assert stdout.flushes == 1
