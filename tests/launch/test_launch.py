"""Real launches: forked ranks on gloo, their output, results, failures, timeouts, interrupts.

Imports internals (launch.plan): a test replaces what the plan sees of the machine.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import psutil
import pytest

import nbaccel
import nbaccel.launch.plan as plan_module
from nbaccel.testing import CollectingSink
from tests.handshake import mark, wait_until_blocked

pytestmark = pytest.mark.timeout(60)


def rank_info() -> dict:
    keys = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "NBACCEL_FORK_LAUNCHED",
        "FORK_LAUNCHED",
        "ACCELERATE_MIXED_PRECISION",
        "GLOO_SOCKET_IFNAME",
    )
    return {"pid": os.getpid(), "ppid": os.getppid(), **{k: os.environ.get(k) for k in keys}}


def all_reduce_rank() -> tuple[int, int, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # env://, as every DDP script does
    value = torch.tensor([dist.get_rank() + 1.0])
    dist.all_reduce(value)
    return dist.get_rank(), dist.get_world_size(), value.item()


def test_every_rank_returns_its_value_in_rank_order() -> None:
    results = nbaccel.notebook_launcher(rank_info, num_processes=3, mixed_precision="bf16")
    assert [r["RANK"] for r in results] == ["0", "1", "2"]
    assert len({r["pid"] for r in results}) == 3
    assert all(r["ppid"] == os.getpid() for r in results)
    first = results[0]
    assert (first["WORLD_SIZE"], first["LOCAL_WORLD_SIZE"], first["NODE_RANK"], first["MASTER_ADDR"]) == ("3", "3", "0", "127.0.0.1")
    assert all(r["NBACCEL_FORK_LAUNCHED"] == r["FORK_LAUNCHED"] == "1" for r in results)
    assert all(r["ACCELERATE_MIXED_PRECISION"] == "bf16" for r in results)
    assert all(r["GLOO_SOCKET_IFNAME"] == "lo" for r in results)
    assert "RANK" not in os.environ and "MASTER_PORT" not in os.environ


def test_one_process_is_still_a_forked_rank() -> None:
    [info] = nbaccel.notebook_launcher(rank_info, num_processes=1)
    assert info["pid"] != os.getpid() and info["WORLD_SIZE"] == "1"


def test_default_on_cpu_is_two_gloo_ranks_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    results = nbaccel.notebook_launcher(all_reduce_rank)
    assert results == [(0, 2, 3.0), (1, 2, 3.0)]
    assert "nbaccel: no GPU visible; launching 2 CPU processes on gloo." in capsys.readouterr().out


@pytest.mark.parametrize("n", [2, 3, 4])
def test_user_code_creates_the_process_group_and_the_launcher_tears_it_down(n: int) -> None:
    results = nbaccel.notebook_launcher(all_reduce_rank, num_processes=n)
    assert results == [(r, n, n * (n + 1) / 2) for r in range(n)]


def join_and_leave_at_once() -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    return dist.get_rank()


@pytest.mark.slow
def test_ranks_that_leave_right_after_joining_never_fail_a_peer_still_connecting() -> None:
    # Without an exit barrier, a rank that returns at once can exit while a peer is still
    # connecting its gloo mesh, and the peer fails with "Connection closed by peer".
    for _ in range(60):
        assert nbaccel.notebook_launcher(join_and_leave_at_once, num_processes=3, output=CollectingSink()) == [0, 1, 2]


def noisy() -> str:
    import ctypes

    rank = int(os.environ["RANK"])
    for i in range(200):
        print(f"py {rank} {i} " + "x" * 300, end="")  # partial writes must still come out whole
        print()
    os.write(1, f"fd-level line from rank {rank}\n".encode())
    ctypes.CDLL(None).printf(f"C printf from rank {rank}\n".encode())  # left in C's buffer until exit
    print(f"to stderr from rank {rank}", file=sys.stderr)
    return "done"


def test_output_at_python_and_fd_level_comes_whole_and_labelled_by_rank() -> None:
    sink = CollectingSink()
    assert nbaccel.notebook_launcher(noisy, num_processes=3, output=sink) == ["done"] * 3
    for rank in range(3):
        stdout = sink.text(rank, "stdout")
        assert [line for line in stdout if line.startswith("py ")] == [f"py {rank} {i} " + "x" * 300 for i in range(200)]
        assert f"fd-level line from rank {rank}" in stdout
        assert f"C printf from rank {rank}" in stdout
        assert sink.text(rank, "stderr") == [f"to stderr from rank {rank}"]


def test_text_output_is_prefixed_with_the_rank(capfd: pytest.CaptureFixture[str]) -> None:
    nbaccel.notebook_launcher(noisy, num_processes=2, output="text")
    out, err = capfd.readouterr()
    assert "[rank 1] fd-level line from rank 1" in out
    assert "[rank 0] to stderr from rank 0" in err
    assert all(line.startswith("[rank ") for line in out.splitlines())


def fail_on_rank_one_while_rank_zero_waits_in_a_collective(marker: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        print("rank 1 about to fail")
        wait_until_blocked(marker)  # rank 0 is blocked in all_reduce
        raise ValueError("boom")
    mark(marker)
    dist.all_reduce(torch.zeros(1))  # never completes: rank 1 never joins
    dist.all_reduce(torch.zeros(1))


def test_failure_names_the_raising_rank_and_stops_the_blocked_peer_fast(tmp_path) -> None:
    with pytest.raises(nbaccel.RankFailedError) as caught:
        nbaccel.notebook_launcher(fail_on_rank_one_while_rank_zero_waits_in_a_collective, (str(tmp_path / "in-all-reduce"),), num_processes=2)
    stopped_at = time.time()
    error = caught.value
    assert str(error).splitlines()[0] == "rank 1 failed: ValueError: boom"
    assert (error.rank, error.exc_type, error.error_message) == (1, "ValueError", "boom")
    assert 'raise ValueError("boom")' in error.remote_traceback  # the source line, as it ran there
    assert "fail_on_rank_one_while_rank_zero_waits_in_a_collective" in error.remote_traceback
    assert "rank 1 about to fail" in error.last_lines
    assert [o.status.value for o in error.outcomes] == ["stopped", "failed"]
    assert error.outcomes[1].exitcode == 1  # it exited by itself: never signalled, code kept
    raised_at = error.outcomes[1].error.timestamp
    assert stopped_at - raised_at < 2.0
    rendered = "\n".join(error._render_traceback_())
    assert "Traceback on rank 1" in rendered and "rank 0: stopped" in rendered


def crash_rank_one_by_signal() -> None:
    if os.environ["RANK"] == "1":
        print("last words of rank 1", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does
    time.sleep(30)


def test_a_rank_killed_by_a_signal_is_reported_with_its_name_and_last_output() -> None:
    started = time.monotonic()
    with pytest.raises(nbaccel.RankFailedError, match=r"^rank 1 failed: killed by SIGKILL") as caught:
        nbaccel.notebook_launcher(crash_rank_one_by_signal, num_processes=2)
    assert time.monotonic() - started < 10
    assert caught.value.signal_name == "SIGKILL" and caught.value.exc_type is None
    assert "last words of rank 1" in caught.value.last_lines


def segfault_on_rank_zero() -> None:
    import ctypes

    if os.environ["RANK"] == "0":
        ctypes.string_at(0)
    time.sleep(30)


def test_a_segfault_shows_the_signal_and_the_python_stack() -> None:
    sink = CollectingSink()
    with pytest.raises(nbaccel.RankFailedError, match=r"^rank 0 failed: killed by SIGSEGV"):
        nbaccel.notebook_launcher(segfault_on_rank_zero, num_processes=2, output=sink)
    stderr = sink.text(0, "stderr")
    assert "Fatal Python error: Segmentation fault" in stderr
    assert any("in segfault_on_rank_zero" in line for line in stderr)


def exit_early() -> None:
    if os.environ["RANK"] == "1":
        os._exit(3)
    if os.environ["RANK"] == "2":
        sys.exit(0)  # a clean exit counts as returning None
    time.sleep(30)


def test_an_early_exit_is_reported_with_its_code() -> None:
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: exited with code 3 without returning"):
        nbaccel.notebook_launcher(exit_early, num_processes=3)


def test_sys_exit_zero_returns_none() -> None:
    def clean_exit() -> None:
        sys.exit(0)

    assert nbaccel.notebook_launcher(clean_exit, num_processes=2) == [None, None]


def print_and_hang() -> None:
    print(f"rank {os.environ['RANK']} is working", flush=True)
    time.sleep(60)


def test_timeout_stops_every_rank_and_says_where_they_were() -> None:
    started = time.monotonic()
    with pytest.raises(nbaccel.LaunchTimeoutError) as caught:
        nbaccel.notebook_launcher(print_and_hang, num_processes=2, timeout=1.0)
    assert 1.0 <= time.monotonic() - started < 3.5
    assert caught.value.running == {0: "rank 0 is working", 1: "rank 1 is working"}
    assert "rank 1: last output: 'rank 1 is working'" in str(caught.value)
    assert isinstance(caught.value, TimeoutError)


def _handlers() -> dict[int, object]:
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}


def _interrupt_self_after(delay: float) -> threading.Timer:
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    return timer


def test_interrupt_raises_keyboard_interrupt_stops_ranks_and_restores_nothing_it_did_not_touch() -> None:
    handlers = _handlers()
    _interrupt_self_after(0.5)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        nbaccel.notebook_launcher(print_and_hang, num_processes=2)
    assert time.monotonic() - started < 5.5
    assert psutil.Process().children() == []
    assert _handlers() == handlers
    assert nbaccel.notebook_launcher(all_reduce_rank, num_processes=2)[0] == (0, 2, 3.0)  # at once


def ignore_signals_and_hang() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ignoring SIGINT and SIGTERM", flush=True)
    time.sleep(60)


@pytest.mark.slow
def test_interrupt_escalates_to_sigkill_for_ranks_that_ignore_signals() -> None:
    _interrupt_self_after(0.5)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        nbaccel.notebook_launcher(ignore_signals_and_hang, num_processes=2)
    assert time.monotonic() - started < 5.5
    assert psutil.Process().children() == []


def big_result() -> bytes:
    return bytes([int(os.environ["RANK"])]) * (100 << 20)


@pytest.mark.slow
def test_a_hundred_megabytes_per_rank_come_back_without_deadlock() -> None:
    results = nbaccel.notebook_launcher(big_result, num_processes=2)
    assert [len(r) for r in results] == [100 << 20] * 2
    assert results[1][:3] == b"\x01\x01\x01"


def unpicklable_result() -> object:
    return threading.Lock()


def test_an_unpicklable_result_names_the_rank_and_the_type() -> None:
    with pytest.raises(nbaccel.RankFailedError, match=r"rank [01] failed: UnpicklableResultError: the return value \(a _thread.lock\) cannot be pickled"):
        nbaccel.notebook_launcher(unpicklable_result, num_processes=2)


def flaky_on_first_attempt() -> int:
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if attempt == 0 and os.environ["RANK"] == "1":
        raise RuntimeError("transient failure")
    return attempt


def test_max_restarts_relaunches_the_group_and_reports_each_attempt(capfd: pytest.CaptureFixture[str]) -> None:
    assert nbaccel.notebook_launcher(flaky_on_first_attempt, num_processes=2, max_restarts=2) == [1, 1]
    assert "attempt 1 of 3 failed (rank 1: failed (RuntimeError: transient failure)); restarting all 2 ranks" in capfd.readouterr().out


def always_fails() -> None:
    raise RuntimeError(f"attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}")


def test_max_restarts_gives_up_with_every_attempt_recorded() -> None:
    with pytest.raises(nbaccel.RankFailedError, match="RuntimeError: attempt 1") as caught:
        nbaccel.notebook_launcher(always_fails, num_processes=2, max_restarts=1)
    assert len(caught.value.attempts) == 2


def test_spawn_carries_closures_defined_anywhere_by_value() -> None:
    offset = 40

    def closure() -> int:
        import nbaccel as nb

        assert os.environ["NBACCEL_FORK_LAUNCHED"] == "1"
        return offset + int(os.environ["RANK"]) + (nb is not None)

    assert nbaccel.notebook_launcher(closure, num_processes=2, start_method="spawn") == [41, 42]


@pytest.mark.slow
def test_spawn_failures_are_reported_like_fork_failures(tmp_path) -> None:
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: boom"):
        nbaccel.notebook_launcher(
            fail_on_rank_one_while_rank_zero_waits_in_a_collective, (str(tmp_path / "in-all-reduce"),), num_processes=2, start_method="spawn"
        )


@pytest.mark.slow
def test_auto_falls_back_to_spawn_with_one_line_when_forking_is_unsafe_and_the_server_is_off(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(plan_module, "fork_hazards", lambda: ["CUDA is already initialised in this kernel"])
    monkeypatch.setenv("NBACCEL_FORK_SERVER", "off")  # with it, tests/launch/test_fork_server.py
    results = nbaccel.notebook_launcher(all_reduce_rank, num_processes=2)
    assert results == [(0, 2, 3.0), (1, 2, 3.0)]
    err = capfd.readouterr().out
    assert "nbaccel: CUDA is already initialised in this kernel; starting the ranks with spawn instead of fork (slower)." in err


def accelerate_view() -> dict:
    from accelerate import Accelerator, PartialState

    accelerator = Accelerator()
    return {
        "index": accelerator.process_index,
        "num": accelerator.num_processes,
        "precision": accelerator.mixed_precision,
        "type": str(accelerator.distributed_type),
        "fork_launched": PartialState().fork_launched,
    }


def test_accelerate_inside_a_launch_sees_rank_world_precision_and_fork_launched() -> None:
    pytest.importorskip("accelerate")
    results = nbaccel.notebook_launcher(accelerate_view, num_processes=2, mixed_precision="bf16")
    assert [r["index"] for r in results] == [0, 1]
    assert all(r["num"] == 2 and r["precision"] == "bf16" and r["fork_launched"] for r in results)
    assert all("MULTI_CPU" in r["type"] for r in results)


def listening_addresses() -> list[str]:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    me = psutil.Process()
    kernel = psutil.Process(os.getppid())
    sockets = me.net_connections("tcp") + kernel.net_connections("tcp")
    dist.barrier()
    return sorted({c.laddr.ip for c in sockets if c.status == psutil.CONN_LISTEN})


def test_a_launch_listens_on_loopback_only() -> None:
    for addresses in nbaccel.notebook_launcher(listening_addresses, num_processes=2):
        assert addresses and all(a.startswith("127.") for a in addresses), addresses


@pytest.mark.slow
def test_two_launches_at_the_same_moment_both_work(tmp_path) -> None:
    import subprocess

    script = tmp_path / "launch.py"
    script.write_text("import nbaccel, tests.launch.test_launch as t\nprint(nbaccel.notebook_launcher(t.all_reduce_rank, num_processes=2))\n")
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env) for _ in range(3)]
    outputs = [p.communicate(timeout=50)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all("[(0, 2, 3.0), (1, 2, 3.0)]" in out for out in outputs)


def test_a_taken_use_port_is_a_clear_error() -> None:
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(nbaccel.PreflightError, match=f"port {port} on 127.0.0.1 is already in use"):
            nbaccel.notebook_launcher(rank_info, num_processes=2, use_port=port)
    assert nbaccel.notebook_launcher(all_reduce_rank, num_processes=2, use_port=port)[1] == (1, 2, 3.0)


WARMING = """
import sys, nbaccel
assert "torch._dynamo" not in sys.modules
def ddp():
    import torch
    nbaccel.PartialState()
    torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
nbaccel.notebook_launcher(ddp, num_processes=2, output="text")
print("warm" if "torch._dynamo" in sys.modules else "cold")
"""


@pytest.mark.slow
def test_modules_ddp_had_to_import_in_every_rank_are_imported_once_in_the_kernel() -> None:
    import subprocess

    run = subprocess.run([sys.executable, "-c", WARMING], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("warm")


def value_of_a_class_only_the_rank_has() -> object:
    namespace: dict = {}
    exec("class OnlyHere:\n    pass\n", {"__name__": "module_only_on_the_rank"}, namespace)
    import sys
    import types

    module = types.ModuleType("module_only_on_the_rank")
    module.OnlyHere = namespace["OnlyHere"]
    sys.modules["module_only_on_the_rank"] = module
    return namespace["OnlyHere"]()


def test_a_value_the_kernel_cannot_unpickle_is_that_ranks_failure() -> None:
    with pytest.raises(nbaccel.RankFailedError, match=r"rank \d's return value reached the kernel but cannot be unpickled there"):
        nbaccel.notebook_launcher(value_of_a_class_only_the_rank_has, num_processes=2)


def log_through_a_kernel_handler() -> str:
    import logging

    logging.getLogger("nbaccel.test.kernel").warning("logged on rank %s", os.environ["RANK"])
    return "ok"


def test_logging_handlers_made_in_the_kernel_write_to_the_rank(capfd: pytest.CaptureFixture[str]) -> None:
    import logging

    logger = logging.getLogger("nbaccel.test.kernel")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    try:
        sink = CollectingSink()
        assert nbaccel.notebook_launcher(log_through_a_kernel_handler, num_processes=2, output=sink) == ["ok", "ok"]
    finally:
        logger.removeHandler(handler)
    assert sink.text(1, "stderr") == ["logged on rank 1"]
