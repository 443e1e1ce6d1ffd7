"""Rank side of "where is each rank?": dump every thread's Python stack when the kernel asks.

The kernel sends ``STACK_SIGNAL`` to the rank's own process (never to its pgid, so DataLoader
workers are left alone). ``faulthandler`` answers from its C-level signal handler: it writes the
stacks even while the rank is blocked inside a C++ collective, where a Python signal handler
would never run, and it costs nothing until the signal comes. The dump is appended to a file
private to the launch (``NBACCEL_STACK_FILE``) that the kernel truncates before each request.

Example::

    install(os.environ.get(STACK_FILE_VARIABLE))  # in the rank, right after the fork
"""

from __future__ import annotations

import faulthandler
import os
import sys

from nbaccel.rank import collective_count
from nbaccel.wire import flight_recorder
from nbaccel.wire.stack_files import STACK_FILE_VARIABLE, STACK_SIGNAL, last_line_path

__all__ = ["STACK_FILE_VARIABLE", "STACK_SIGNAL", "install", "prepare"]

_dump_fd: int | None = None  # kept open for the handler, for the rank's lifetime


def install(path: str | None) -> None:
    """Dump all threads' stacks to ``path`` on STACK_SIGNAL; nothing when ``path`` is unset."""
    global _dump_fd
    if not path:
        return
    # Raw fds, no Python file objects: a rank's start-up cost is mostly the memory pages it
    # writes to (copy-on-write from the kernel), and each file object is several new objects.
    # Append: each dump lands where the kernel truncated.
    _dump_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    last = os.open(last_line_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(last, _OUTERMOST_AT_FORK or _outermost_frame_line().encode())
    finally:
        os.close(last)
    faulthandler.register(STACK_SIGNAL, file=_dump_fd, all_threads=True, chain=False)
    collective_count.start_answering(path)  # the count of collectives, which no dump can show
    if os.environ.get(flight_recorder.BUFFER_VARIABLE, "0") not in ("", "0"):
        # Before any process group exists: NCCL's watchdog reads these when it starts.
        for name, value in flight_recorder.recorder_paths(path).items():
            os.environ.setdefault(name, value)


def _outermost_frame_line() -> str:
    frame = sys._getframe()
    while frame.f_back is not None:
        frame = frame.f_back
    return f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}\n'


def prepare() -> None:
    """Kernel side, before a fork (``os.register_at_fork``): the outermost frame line, which a
    forked rank shares with the kernel (its stack below the bootstrap is the kernel's at the fork).

    Walking the kernel's stack in each rank would make a frame object per frame there, and copy
    their pages; a rank started otherwise (spawn) walks its own.

    Example:
        >>> prepare()
        >>> sys.modules[__name__]._OUTERMOST_AT_FORK.startswith(b'  File "')
        True
    """
    global _OUTERMOST_AT_FORK
    _OUTERMOST_AT_FORK = _outermost_frame_line().encode()


_OUTERMOST_AT_FORK: bytes = b""  # set in the forking process right before each fork


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=prepare)
