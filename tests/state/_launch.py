"""Run a function on N forked CPU ranks and return every rank's value: the tests' one seam to a launcher.

`fork_launch` mirrors ``nbaccel.notebook_launcher(fn, args=(), num_processes=N)``: each rank is
forked from the test process, gets the launcher's environment (``nbaccel.env.rank_environment``:
RANK, WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_USE_AGENT_STORE=True, NBACCEL_FORK_LAUNCHED=1,
...), attaches to a fresh TCPStore the parent hosts on 127.0.0.1, and sends its return value back
through a pipe; its output is relayed as ``[rank r] ...`` lines to ``sys.stdout``. Every child is
reaped before it returns, and killed when ``TIMEOUT_S`` passes.

The tests call `launch`; to run them on the real launcher, change the one line at the bottom
(or set NBACCEL_STATE_TESTS_LAUNCHER=notebook).

Example::

    assert launch(lambda: PartialState().process_index, num_processes=2) == [0, 1]
"""

from __future__ import annotations

import os
import pickle
import selectors
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from torch.distributed import TCPStore

from nbaccel.env import rank_environment

TIMEOUT_S = 60.0


class RankFailed(AssertionError):
    """A rank raised (its traceback is in the message), crashed, or the launch timed out."""


def fork_launch(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2) -> list[Any]:
    """``function(*args)`` on ``num_processes`` forked ranks; their values by rank."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(num_processes)
    port = listener.getsockname()[1]
    # A fresh store per launch: no key of an earlier launch can leak into this one.
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=listener.detach())
    ranks: dict[int, _Rank] = {}
    try:
        for rank in range(num_processes):
            ranks[rank] = _start(rank, num_processes, port, function, tuple(args), ranks)
        _collect(ranks, time.monotonic() + TIMEOUT_S)
    finally:
        _reap(ranks)
        del store
    return _results(ranks)


class _Rank:
    def __init__(self, pid: int, out_fd: int, result_fd: int) -> None:
        self.pid, self.out_fd, self.result_fd = pid, out_fd, result_fd
        self.output = b""
        self.pending = b""  # an unfinished output line
        self.result = b""
        self.status: int | None = None


def _start(rank: int, world: int, port: int, function: Callable[..., Any], args: tuple[Any, ...], started: dict[int, _Rank]) -> _Rank:
    out_r, out_w = os.pipe()
    result_r, result_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank: never returns into pytest's stack
        try:
            for other in started.values():
                os.close(other.out_fd)
                os.close(other.result_fd)
            os.close(out_r)
            os.close(result_r)
            _run_rank(rank, world, port, function, args, out_w, result_w)
        finally:
            os._exit(0)
    os.close(out_w)
    os.close(result_w)
    return _Rank(pid, out_r, result_r)


def _run_rank(rank: int, world: int, port: int, function: Callable[..., Any], args: tuple[Any, ...], out_w: int, result_w: int) -> None:
    os.dup2(out_w, 1)
    os.dup2(out_w, 2)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.update(rank_environment(rank=rank, world_size=world, master_port=port, device_type="cpu"))
    from nbaccel.state import reset_all_states

    reset_all_states()  # as nbaccel's worker does: no state inherited from the test process
    try:
        outcome: tuple[Any, ...] = ("ok", function(*args))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        outcome = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    try:
        payload = pickle.dumps(outcome)
    except Exception as exc:  # noqa: BLE001
        payload = pickle.dumps(("error", f"unpicklable result: {exc}", ""))
    sys.stdout.flush()
    sys.stderr.flush()
    with os.fdopen(result_w, "wb") as pipe:
        pipe.write(payload)
    import torch.distributed as dist

    if dist.is_initialized():  # the launcher owns teardown, as nbaccel's does
        dist.destroy_process_group()


def _collect(ranks: dict[int, _Rank], deadline: float) -> None:
    """Read every rank's output and result until all pipes close; relay output as it comes."""
    selector = selectors.DefaultSelector()
    for rank, info in ranks.items():
        selector.register(info.out_fd, selectors.EVENT_READ, (rank, "out"))
        selector.register(info.result_fd, selectors.EVENT_READ, (rank, "result"))
    try:
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RankFailed(f"launch timed out after {TIMEOUT_S:g} s; output so far:\n{_all_output(ranks)}")
            for key, _ in selector.select(timeout=remaining):
                rank, what = key.data
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    os.close(key.fd)
                    if what == "out":
                        _relay(rank, ranks[rank], b"", final=True)
                elif what == "out":
                    _relay(rank, ranks[rank], chunk)
                else:
                    ranks[rank].result += chunk
    finally:
        for key in list(selector.get_map().values()):
            os.close(key.fd)
        selector.close()


def _relay(rank: int, info: _Rank, chunk: bytes, final: bool = False) -> None:
    info.output += chunk
    data = info.pending + chunk
    lines = data.split(b"\n")
    info.pending = b"" if final else lines.pop()
    for line in lines:
        if line or not final:
            sys.stdout.write(f"[rank {rank}] {line.decode(errors='replace')}\n")


def _reap(ranks: dict[int, _Rank]) -> None:
    """Wait for every rank briefly, then kill and reap whatever still runs."""
    deadline = time.monotonic() + 5.0
    for info in ranks.values():
        while info.status is None and time.monotonic() < deadline:
            pid, status = os.waitpid(info.pid, os.WNOHANG)
            if pid:
                info.status = status
            else:
                time.sleep(0.005)
        if info.status is None:
            os.kill(info.pid, signal.SIGKILL)
            info.status = os.waitpid(info.pid, 0)[1]


def _results(ranks: dict[int, _Rank]) -> list[Any]:
    values, failures = [], []
    for rank, info in sorted(ranks.items()):
        if not info.result:
            failures.append(f"rank {rank} sent no result (wait status {info.status})")
            continue
        outcome = pickle.loads(info.result)
        if outcome[0] == "ok":
            values.append(outcome[1])
        else:
            failures.append(f"rank {rank} raised {outcome[1]}\n{outcome[2]}")
    if failures:
        raise RankFailed("\n".join(failures) + f"\noutput:\n{_all_output(ranks)}")
    return values


def _all_output(ranks: dict[int, _Rank]) -> str:
    return "\n".join(f"--- rank {r} ---\n{i.output.decode(errors='replace')}" for r, i in sorted(ranks.items()))


def _notebook_launcher(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2) -> list[Any]:
    from nbaccel.launcher import notebook_launcher

    return notebook_launcher(function, args=args, num_processes=num_processes, cpu=True, timeout=TIMEOUT_S)


# The one line to change to run the state tests on nbaccel's launcher: launch = _notebook_launcher
launch = _notebook_launcher if os.environ.get("NBACCEL_STATE_TESTS_LAUNCHER") == "notebook" else fork_launch
