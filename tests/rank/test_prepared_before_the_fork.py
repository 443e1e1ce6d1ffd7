"""What the kernel makes before a fork so that a rank writes fewer of its pages (issue 28): each
piece still gives the rank what it gave when the rank made it itself.

Imports internals (rank.cpu_threads, rank.display_hooks, rank.exit_hooks, launch.starters.fork):
it tests those units directly, below the public face, beside real launches.
"""

from __future__ import annotations

import gc
import multiprocessing.util
import os
import weakref

import pytest

import nbaccel
from nbaccel.launch.starters.fork import _prepare
from nbaccel.rank import display_hooks, exit_hooks, stack_dump
from nbaccel.rank.cpu_threads import OMP_NUM_THREADS, ONE_THREAD_VARIABLE, planned_threads, threads_per_rank
from nbaccel.state import reset_all_states
from nbaccel.wire import events
from nbaccel.wire.job import Job

pytestmark = pytest.mark.timeout(60)


def test_the_threads_planned_before_the_fork_keep_the_users_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OMP_NUM_THREADS, raising=False)
    monkeypatch.delenv(ONE_THREAD_VARIABLE, raising=False)
    assert planned_threads({"LOCAL_WORLD_SIZE": "2"}) == threads_per_rank(2)
    assert planned_threads({"LOCAL_WORLD_SIZE": "2", OMP_NUM_THREADS: "3"}) is None  # given for the launch
    assert planned_threads({"LOCAL_WORLD_SIZE": "2", ONE_THREAD_VARIABLE: "1", OMP_NUM_THREADS: "3"}) == 1  # a dead OpenMP pool wins
    monkeypatch.setenv(OMP_NUM_THREADS, "5")
    assert planned_threads({"LOCAL_WORLD_SIZE": "2"}) is None  # set in the kernel


def test_the_fork_starter_puts_the_threads_in_the_block_and_opens_the_stack_file(tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(OMP_NUM_THREADS, raising=False)
    monkeypatch.delenv(ONE_THREAD_VARIABLE, raising=False)
    path = os.path.join(tmp_path, "rank0")
    prepared = _prepare(Job(print), 0, {"LOCAL_WORLD_SIZE": "1", stack_dump.STACK_FILE_VARIABLE: path})
    if prepared is None:
        pytest.skip("this libc's environ cannot be replaced: the rank sets each variable itself")
    try:
        assert prepared.threads == threads_per_rank(1)
        assert prepared.title is not None and prepared.title[1] == b"nbaccel-r0/1"
        assert prepared.data[OMP_NUM_THREADS.encode()] == str(threads_per_rank(1)).encode()
        assert prepared.stack_fd is not None
        os.write(prepared.stack_fd, b"dump\n")
        with open(path, "rb") as dump, open(stack_dump.last_line_path(path), "rb") as last:
            assert dump.read() == b"dump\n"
            assert last.read().startswith(b'  File "')
    finally:
        if prepared.stack_fd is not None:
            os.close(prepared.stack_fd)


@pytest.mark.parametrize("pid", [1, 65_536, 4_194_304, 2**31 - 1])
def test_the_started_frame_is_the_one_send_bytes_writes(pid: int) -> None:
    read, write = os.pipe()
    try:
        display_hooks._send_started(write, pid)
        whole = os.read(read, 65536)
        events.send_bytes(write, events.Kind.RICH, display_hooks.started_payload(pid))
        assert whole == os.read(read, 65536)
    finally:
        os.close(read)
        os.close(write)


class _Forked:
    after: int | None = None


def _note_fork(target: _Forked) -> None:
    target.after = os.getpid()


def test_the_after_forkers_listed_before_a_fork_keep_no_object_alive() -> None:
    target = _Forked()
    multiprocessing.util.register_after_fork(target, _note_fork)
    exit_hooks.prepare()
    assert any(ref() is target for _, ref in exit_hooks._prepared["after_forkers"])
    gone = weakref.ref(target)
    del target
    gc.collect()
    assert gone() is None  # weak references, as multiprocessing's registry holds them


KERNEL_SIDE: dict[str, _Forked] = {}


def after_fork_ran() -> bool:
    return KERNEL_SIDE["target"].after == os.getpid()


def test_an_after_forker_registered_in_the_kernel_runs_in_each_rank() -> None:
    KERNEL_SIDE["target"] = _Forked()
    multiprocessing.util.register_after_fork(KERNEL_SIDE["target"], _note_fork)
    try:
        assert nbaccel.notebook_launcher(after_fork_ran, num_processes=2, output="text", timeout=30) == [True, True]
    finally:
        KERNEL_SIDE.clear()  # its registry entry goes with it (a weak reference)


def processes_in_state() -> int:
    return int(nbaccel.PartialState().num_processes)


def test_a_state_the_kernel_made_is_forgotten_in_the_ranks() -> None:
    assert nbaccel.PartialState().num_processes == 1  # the kernel's own, held across the fork
    try:
        assert nbaccel.notebook_launcher(processes_in_state, num_processes=2, output="text", timeout=30) == [2, 2]
    finally:
        reset_all_states()


def test_the_stack_dump_reads_the_environment_as_os_environ_does(monkeypatch: pytest.MonkeyPatch) -> None:
    name = "NBACCEL_TEST_PREPARED_VALUE"
    monkeypatch.delenv(name, raising=False)
    assert stack_dump._environment_value(name) == "0"
    monkeypatch.setenv(name, "")
    assert stack_dump._environment_value(name) == ""
    monkeypatch.setenv(name, "2000")
    assert stack_dump._environment_value(name) == os.environ.get(name) == "2000"
