"""nbaccel leaves the kernel's SIGINT handling as it found it: Jupyter's stop button relies on it.

The kernel's SIGINT handler and its main thread's signal mask (and the handlers of SIGTERM,
SIGHUP and SIGQUIT, which torch elastic would replace for good) are read before and after each
way nbaccel runs code: a launch, a pool started, used and stopped, an interrupted launch, an
interrupted task, a debugger session. A handler of the test's own stands in for ipykernel's
(so a "restore" to Python's default would show), and a blocked SIGWINCH marks the mask; SIG_IGN
stands for a script started in the background. Whatever the kernel has, each rank starts with
Python's handler and SIGINT unblocked, so nbaccel's own interrupt of a rank always lands.

Imports internals (launch.debug_desk): the kernel's stdin is stood in for.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

import nbaccel
from nbaccel.launch import debug_desk
from nbaccel.testing import CollectingSink
from tests.handshake import InterruptOnceAllSay

pytestmark = pytest.mark.timeout(90)

_NAMED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def handling() -> dict[str, Any]:
    """What this thread has: each named signal's handler, and its blocked signals."""
    return {**{s.name: signal.getsignal(s) for s in _NAMED}, "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ()))}


def kernels_own_handler(signum: int, frame: object) -> None:
    """A stand-in for ipykernel's handler: an interrupt raises KeyboardInterrupt."""
    raise KeyboardInterrupt


@contextlib.contextmanager
def kernel_with(handler: Any) -> Iterator[dict[str, Any]]:
    """The kernel's SIGINT handler set to ``handler`` and SIGWINCH blocked, put back after; yields
    what nbaccel must leave as it is."""
    previous = signal.signal(signal.SIGINT, handler)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGWINCH})
    try:
        yield handling()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(params=[kernels_own_handler, signal.SIG_IGN], ids=["kernel's own handler", "ignored"])
def kernel_handling(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    with kernel_with(request.param) as kept:
        yield kept


@pytest.fixture
def interruptible() -> Iterator[dict[str, Any]]:
    with kernel_with(kernels_own_handler) as kept:
        yield kept


def rank_handling() -> dict[str, Any]:
    """What a rank starts with."""
    return {"SIGINT": repr(signal.getsignal(signal.SIGINT)), "SIGINT blocked": signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())}


RANKS_START_INTERRUPTIBLE = {"SIGINT": repr(signal.default_int_handler), "SIGINT blocked": False}


def test_a_launch_leaves_the_kernels_handling_and_its_ranks_are_interruptible(kernel_handling: dict[str, Any]) -> None:
    assert nbaccel.notebook_launcher(rank_handling, num_processes=2, output=CollectingSink()) == [RANKS_START_INTERRUPTIBLE] * 2
    assert handling() == kernel_handling


def test_a_kernel_that_blocks_sigint_still_starts_interruptible_ranks(kernel_handling: dict[str, Any]) -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        assert nbaccel.notebook_launcher(rank_handling, num_processes=2, output=CollectingSink()) == [RANKS_START_INTERRUPTIBLE] * 2
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    assert handling() == kernel_handling


# A worker's own handler: SIGINT raises KeyboardInterrupt only while a task runs.
WORKERS_INTERRUPTIBLE = {"SIGINT": "TaskInterrupts.handle", "SIGINT blocked": False}


def worker_handling() -> dict[str, Any]:
    handler = signal.getsignal(signal.SIGINT)
    return {"SIGINT": getattr(handler, "__qualname__", repr(handler)), "SIGINT blocked": signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())}


def test_a_pool_started_used_and_stopped_leaves_the_kernels_handling(kernel_handling: dict[str, Any]) -> None:
    with nbaccel.start_workers(2) as pool:
        assert handling() == kernel_handling
        assert pool.run(worker_handling, output=CollectingSink()) == [WORKERS_INTERRUPTIBLE] * 2
        assert handling() == kernel_handling
    assert handling() == kernel_handling


def work_until_interrupted() -> None:
    import time

    print("working", flush=True)
    time.sleep(30)


def test_an_interrupted_launch_leaves_the_kernels_handling(interruptible: dict[str, Any]) -> None:
    with pytest.raises(KeyboardInterrupt):
        nbaccel.notebook_launcher(work_until_interrupted, num_processes=2, output=InterruptOnceAllSay("working"))
    assert handling() == interruptible


def test_an_interrupted_task_leaves_the_kernels_handling(interruptible: dict[str, Any]) -> None:
    with nbaccel.start_workers(2) as pool:
        with pytest.raises(KeyboardInterrupt):
            pool.run(work_until_interrupted, output=InterruptOnceAllSay("working"))
        assert handling() == interruptible
        assert pool.run(worker_handling, output=CollectingSink()) == [WORKERS_INTERRUPTIBLE] * 2  # the pool lives on
    assert handling() == interruptible


class Answers:
    """The kernel's stdin, answering each prompt with the next line."""

    def __init__(self, lines: list[str]) -> None:
        self.lines, self.prompts = list(lines), []  # type: ignore[var-annotated]

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.lines.pop(0)


def break_on_rank_one() -> int:
    rank = int(os.environ["RANK"])
    if rank == 1:
        breakpoint()
    return rank


def test_a_debugger_session_leaves_the_kernels_handling(kernel_handling: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    scripted = Answers(["p rank", "c"])
    monkeypatch.setattr(debug_desk, "kernel_stdin", lambda: scripted)
    assert nbaccel.notebook_launcher(break_on_rank_one, num_processes=2, output=CollectingSink()) == [0, 1]
    assert len(scripted.prompts) == 2  # the session ran: two commands at rank 1's prompt
    assert handling() == kernel_handling
