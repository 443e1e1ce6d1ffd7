"""multiprocessing's objects and atexit handlers across nbaccel's fork, on 2 real ranks.

A bare fork skipped multiprocessing's after-fork hooks and the rank's os._exit skipped its exit
function: an inherited queue counted items get() never saw, and items put right before a rank
returned were lost (issue 16). Each test here failed that way before rank/exit_hooks.py.
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbaccel
from nbaccel.testing import CollectingSink, scaled

FORK = multiprocessing.get_context("fork")


def _close_queue(q: Any) -> None:
    q.close()
    q.join_thread()
    q._reader.close()  # a queue the kernel never put on keeps both ends open after close()
    q._writer.close()


@pytest.fixture
def fork_queue() -> Iterator[Any]:
    q = FORK.Queue()
    yield q
    _close_queue(q)


def put_rank(q: Any) -> None:
    q.put(int(os.environ["RANK"]))  # and return at once: the feeder must flush before the rank exits


def test_every_item_a_rank_puts_on_a_queue_passed_as_argument_arrives(fork_queue: Any) -> None:
    nbaccel.notebook_launcher(put_rank, (fork_queue,), num_processes=2, output="text", timeout=scaled(60))
    got = sorted(fork_queue.get(timeout=scaled(5)) for _ in range(2))
    assert got == [0, 1]
    with pytest.raises(queue.Empty):
        fork_queue.get(timeout=0.2)


INHERITED: dict[str, Any] = {}


def use_inherited() -> tuple[int, bool, bool]:
    q, event, counter, array, lock = (INHERITED[k] for k in ("queue", "event", "counter", "array", "lock"))
    rank = int(os.environ["RANK"])
    q.put(rank)
    with lock:
        counter.value += 1
    array[rank] = rank + 10
    event.set()
    parent = multiprocessing.parent_process()
    return len(multiprocessing.active_children()), multiprocessing.current_process().name == "MainProcess", parent is None


@pytest.fixture(scope="module")
def shared_memory_arena() -> Iterator[Any]:
    """multiprocessing's heap maps its shared-memory arena once and keeps it for the process's
    life: opened before the test, so the leak check does not count it."""
    value = FORK.Value("i", 0)
    yield value
    del value


def test_inherited_queue_event_value_array_and_lock_work_in_every_rank(shared_memory_arena: Any) -> None:
    q = FORK.Queue()
    q.put("from the kernel")  # the kernel's own feeder thread runs: a rank must not think it its own
    assert q.get(timeout=scaled(5)) == "from the kernel"
    INHERITED.update(queue=q, event=FORK.Event(), counter=FORK.Value("i", 0), array=FORK.Array("i", 2), lock=FORK.Lock())
    try:
        values = nbaccel.notebook_launcher(use_inherited, num_processes=2, output="text", timeout=scaled(60))
        assert values == [(0, True, True), (0, True, True)]  # no kernel children; a main process, as under torchrun
        assert sorted(q.get(timeout=scaled(5)) for _ in range(2)) == [0, 1]
        assert INHERITED["event"].is_set() and INHERITED["counter"].value == 2 and list(INHERITED["array"]) == [10, 11]
    finally:
        INHERITED.clear()
        _close_queue(q)


def update_shared(shared: Any, lock: Any) -> str:
    rank = os.environ["RANK"]
    with lock:
        shared[rank] = os.getpid()
    return rank


def test_manager_dict_and_lock_proxies_passed_as_arguments_work_in_every_rank() -> None:
    with FORK.Manager() as manager:
        shared, lock = manager.dict(), manager.Lock()
        shared["kernel"] = os.getpid()  # the kernel's own connection is open: ranks need theirs
        assert nbaccel.notebook_launcher(update_shared, (shared, lock), num_processes=2, output="text", timeout=scaled(60)) == ["0", "1"]
        got = dict(shared)
        assert set(got) == {"kernel", "0", "1"} and got["kernel"] == os.getpid() and got["0"] != got["1"]
        del shared, lock


def register_writer(folder: str) -> int:
    path = Path(folder) / f"rank{os.environ['RANK']}"
    atexit.register(path.write_text, "flushed")  # a logger's flush, a tracker's finish()
    return os.getpid()


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_an_atexit_handler_a_rank_registers_runs_and_the_kernels_never_does(tmp_path: Path, start_method: str) -> None:
    kernel_marks = tmp_path / "kernel"
    kernel_marks.mkdir()

    def kernel_side() -> None:  # registered in the kernel: it must never run in a rank
        (kernel_marks / str(os.getpid())).write_text("ran")

    atexit.register(kernel_side)
    try:
        pids = nbaccel.notebook_launcher(register_writer, (str(tmp_path),), num_processes=2, start_method=start_method, output="text", timeout=scaled(60))
    finally:
        atexit.unregister(kernel_side)
    assert len(set(pids)) == 2
    assert (tmp_path / "rank0").read_text() == "flushed" and (tmp_path / "rank1").read_text() == "flushed"
    assert list(kernel_marks.iterdir()) == []


def register_hanging() -> None:
    atexit.register(time.sleep, 600)


def test_a_hanging_atexit_handler_is_bounded_and_said_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBACCEL_EXIT_TIMEOUT", "1")
    sink = CollectingSink()
    started = time.monotonic()
    assert nbaccel.notebook_launcher(register_hanging, num_processes=2, output=sink, timeout=scaled(60)) == [None, None]
    assert time.monotonic() - started < scaled(30)
    for rank in (0, 1):
        said = [line for line in sink.text(rank, "stderr") if "exit handlers" in line]
        assert said == [
            "nbaccel: the rank's exit handlers (atexit, multiprocessing) still ran after 1 s (NBACCEL_EXIT_TIMEOUT); exiting without waiting for them"
        ]
