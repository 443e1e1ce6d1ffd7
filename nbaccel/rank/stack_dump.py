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
import signal
import sys

from nbaccel.rank import collective_count
from nbaccel.wire import flight_recorder

STACK_SIGNAL = signal.SIGUSR2
STACK_FILE_VARIABLE = "NBACCEL_STACK_FILE"

_dump_fd: int | None = None  # kept open for the handler, for the rank's lifetime


def install(path: str | None, fd: int | None = None) -> None:
    """Dump all threads' stacks to ``path`` on STACK_SIGNAL; nothing when ``path`` is unset.

    ``fd``: the dump file ``open_for_rank(path)`` opened in the parent before the fork (its
    last-line file written too); without it the rank opens both itself.
    """
    global _dump_fd
    if not path:
        return
    _dump_fd = fd if fd is not None else open_for_rank(path, _OUTERMOST_AT_FORK or _outermost_frame_line().encode())
    faulthandler.register(STACK_SIGNAL, file=_dump_fd, all_threads=True, chain=False)
    collective_count.start_answering(path)  # the count of collectives, which no dump can show
    if _environment_value(flight_recorder.BUFFER_VARIABLE) not in ("", "0"):
        # Before any process group exists: NCCL's watchdog reads these when it starts.
        for name, value in flight_recorder.recorder_paths(path).items():
            os.environ.setdefault(name, value)


def _environment_value(name: str) -> str:
    """``os.environ.get(name, "0")``, from its own dict where it has one: the mapping's ``get``
    raises and catches a KeyError for a name that is not set, machinery a fresh rank copied
    (~20 pages)."""
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict) or os.name != "posix":
        return os.environ.get(name, "0")
    value = data.get(name.encode())
    return "0" if value is None else os.fsdecode(value)


def open_for_rank(path: str, last_line: bytes | None = None) -> int:
    """The dump file of the rank dumping to ``path``, open for appending, and its last-line file
    written (``last_line``: the outermost frame's line, by default this process's).

    A fork starter calls it in the parent, before the fork, and closes its own copy after: a
    rank making the files itself paid ~30 copied pages and 200 us for two ``open`` calls.

    Example:
        >>> import tempfile; folder = tempfile.mkdtemp()
        >>> fd = open_for_rank(os.path.join(folder, "rank0")); os.close(fd)
        >>> open(last_line_path(os.path.join(folder, "rank0")), "rb").read().startswith(b'  File "')
        True
    """
    # Raw fds, no Python file objects: a rank's start-up cost is mostly the memory pages it
    # writes to (copy-on-write from the kernel), and each file object is several new objects.
    # Append: each dump lands where the kernel truncated.
    dump = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
    try:
        last = os.open(last_line_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.write(last, last_line if last_line is not None else _outermost_frame_line().encode())
        finally:
            os.close(last)
    except BaseException:
        os.close(dump)
        raise
    return dump


def last_line_path(path: str) -> str:
    """Where the rank says how its dumps end: faulthandler writes no end marker, but it dumps the
    main thread (the oldest) last, and that stack always ends in the same outermost frame."""
    return path + ".last"


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
