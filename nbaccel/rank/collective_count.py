"""How many collectives this rank issued on its default group, told to the kernel even while stuck.

torch counts the collectives each process issued on a group (its sequence number). Ranks that
disagree about it pair the wrong collectives. On gloo there is no flight recorder, so the count
is the one thing that says which rank is behind when ranks are stuck; it lives in the process, out
of reach of ``faulthandler``'s dump. A daemon thread answers for it: it blocks on a named pipe in
the launch's private stack folder (no cost until asked) and, on a byte from the kernel, writes
the count beside it. Collectives release the GIL while they wait, so it answers then too.

Example:
    >>> collective_count() is None  # no process group here
    True
"""

from __future__ import annotations

import _thread
import functools
import os
import sys
import threading
from typing import Any

from nbaccel.rank.import_hooks import when_imported
from nbaccel.wire.stack_files import count_answer_path, count_pipe_path


def collective_count() -> int | None:
    """The default group's sequence number in this process, or None without a group (or a torch
    that keeps no count)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    counter = getattr(dist.group.WORLD, "_get_sequence_number_for_group", None)
    if counter is None:
        return None
    try:
        return int(counter())
    except RuntimeError:  # a backend that keeps no count (some third-party ones)
        return None


def start_answering(stack_file: str) -> None:
    """Answer for this rank's count once it has a default process group, for the rank's lifetime.

    The pipe and the thread are made when the first default group is: torch's public
    ``init_process_group`` is wrapped in each module of torch that holds it (``torch.distributed``
    and ``distributed_c10d``, where user code and libraries call it, and ``device_mesh``, where
    ``init_device_mesh`` does). A rank that never makes a group has nothing to count, and would pay
    a thread and a FIFO at its start for nothing; a torch without ``torch.distributed`` has none.

    The wrap is made once, in the process that forks the ranks (``wrap_loaded``, before each fork),
    where ``torch.distributed`` is loaded there: a forked rank only names its stack file here (the
    wrap in each rank copied ~40 pages). Elsewhere (spawn, or no torch in the kernel) the rank
    wraps when ``torch.distributed`` is imported.
    """
    global _answering
    _answering = (os.getpid(), stack_file)
    if not _wrapped:
        when_imported("torch.distributed", _wrap)


def wrap_loaded() -> None:
    """Wrap ``init_process_group`` here if ``torch.distributed`` is loaded and not yet wrapped.

    Runs before each fork (``os.register_at_fork``), so ranks inherit the wrap. In a process that
    is not a rank answering for its count (the kernel, a fork server, a DataLoader worker) the
    wrapper only calls torch's: no pipe, no thread.

    Example:
        >>> wrap_loaded()  # no torch.distributed loaded, or wrapped already: nothing to do
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and not _wrapped:
        _wrap(dist)


_HOLDERS = ("torch.distributed", "torch.distributed.distributed_c10d", "torch.distributed.device_mesh")
_answering: tuple[int, str] | None = None  # (pid, stack file) of the rank answering in this process
_wrapped = False  # init_process_group wrapped in this process (or in the one it was forked from)
_started_in = 0  # the pid whose answering thread runs: a fork of the rank has none


def _wrap(dist: Any) -> None:
    global _wrapped
    original = getattr(dist, "init_process_group", None)
    if _wrapped or not callable(original):  # a torch built without distributed: no group will ever be made
        return
    _wrapped = True
    holders: list[Any] = [m for m in map(sys.modules.get, _HOLDERS) if m is not None and getattr(m, "init_process_group", None) is original]

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        _on_group_made()
        return result

    for module in holders:
        module.init_process_group = init_process_group


def _on_group_made() -> None:
    """After a default group is made: start answering, once, if this process is the rank that asked."""
    global _started_in
    target, pid = _answering, os.getpid()
    if target is None or target[0] != pid or _started_in == pid:
        return  # the kernel, a fork of a rank, or a thread already answering (a group made again)
    _started_in = pid
    _start(target[1])


def _start(stack_file: str) -> None:
    """Make the pipe and start the daemon thread that answers on it."""
    pipe = count_pipe_path(stack_file)
    try:
        try:
            os.mkfifo(pipe, 0o600)
        except FileExistsError:  # left by an earlier process of this rank: its reader is gone
            os.unlink(pipe)
            os.mkfifo(pipe, 0o600)
        fd = os.open(pipe, os.O_RDWR)  # read-write: opening never blocks, and reads never see EOF
    except OSError:  # a folder without FIFOs: the summary just goes without the count
        return
    # Not threading.Thread: its start() waits until the new thread has run, a GIL hand-over that
    # cost every rank 1-4 ms of its launch (benchmarks/launch_bench.py's breakdown). Nothing waits
    # for this thread: the rank ends with os._exit, and the kernel asks only when it takes stacks.
    _thread.start_new_thread(_answer_forever, (fd, count_answer_path(stack_file)))


def _answer_forever(fd: int, answer: str) -> None:
    named = False
    while os.read(fd, 64):
        if not named:  # at the first question, not at the rank's start, whose pages it would copy
            # Known to threading (a dummy thread, daemonic), so threading.enumerate() lists it as Python's.
            threading.current_thread().name = "nbaccel-collective-count"
            named = True
        count = collective_count()
        partial = answer + ".partial"
        with open(partial, "w", encoding="utf-8") as out:
            out.write("" if count is None else str(count))
        os.replace(partial, answer)  # whole or absent: the kernel never reads half an answer


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=wrap_loaded)
