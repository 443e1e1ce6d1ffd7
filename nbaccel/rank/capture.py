"""Rank side of the output pipeline: point fds 1/2 and sys.stdout/sys.stderr at the rank's pipes.

Both levels matter: Python's ``print`` goes through ``sys.stdout`` (under ipykernel an OutStream
that a forked child must not use), while C++/NCCL/gloo logs write to fd 1 and 2 directly.

Example (in a freshly forked rank)::

    redirect_stdio(stdout_fd=pipes.stdout_w, stderr_fd=pipes.stderr_w)
    print("hello")  # reaches the kernel's relay as one whole line of this rank's stdout
"""

from __future__ import annotations

import ctypes
import io
import logging
import os
import sys
import weakref
from typing import Any

try:  # fflush(NULL) pushes out C stdio buffers that os._exit would otherwise drop
    _libc: ctypes.CDLL | None = ctypes.CDLL(None)
except OSError:  # pragma: no cover - exotic platforms without a C runtime handle
    _libc = None


def redirect_stdio(stdout_fd: int, stderr_fd: int) -> None:
    """Make fds 1 and 2 the rank's pipes and rebind the Python streams onto them."""
    # The streams being replaced, to find the handlers writing to them, where the kernel did not
    # list those before the fork (a spawned rank).
    old_streams = _stream_ids() if _KERNEL_STREAM_HANDLERS is None else None
    os.dup2(stdout_fd, 1)
    os.dup2(stderr_fd, 2)
    if stdout_fd > 2:
        os.close(stdout_fd)
    if stderr_fd > 2:
        os.close(stderr_fd)
    stdout, stderr = _RANK_STREAMS[0] if _RANK_STREAMS else (_text_stream(1), _text_stream(2))
    # typeshed marks sys.__stdout__/__stderr__ Final; a rank rebinds them on purpose.
    sys.stdout = sys.__stdout__ = stdout  # type: ignore[misc]
    sys.stderr = sys.__stderr__ = stderr  # type: ignore[misc]
    _retarget_logging(old_streams)


def prepare() -> None:
    """Kernel side, before a fork (``os.register_at_fork``): the rank's two streams, made once.

    A forked rank then only binds them: making six stream objects in every rank would write
    (and so copy, page by page) more of the kernel's memory than binding two does. They wrap
    fds 1 and 2 without owning them and are never written in the kernel, so every rank forked
    from it binds its own copy of the same, still empty, pair (``redirect_stdio``). It also lists
    the logging handlers that write to the kernel's streams, which each rank points at its own.

    Example:
        >>> prepare(); len(_RANK_STREAMS)
        1
    """
    global _KERNEL_STREAM_HANDLERS
    if not _RANK_STREAMS:
        _RANK_STREAMS.append((_text_stream(1), _text_stream(2)))
    # Held too: a rank rebinding the four names must not free the kernel's stream objects
    # (freeing writes their pages; a last reference dropped would even flush them).
    _KERNEL_STREAMS[:] = (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    _KERNEL_STREAM_HANDLERS = _stream_handlers(_stream_ids())


_RANK_STREAMS: list[tuple[io.TextIOWrapper, io.TextIOWrapper]] = []  # at most one pair, unused in the kernel
_KERNEL_STREAMS: list[Any] = []  # the process's four streams at the last fork


def _stream_ids() -> set[int]:
    return {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None}


def _text_stream(fd: int) -> io.TextIOWrapper:
    raw = io.FileIO(fd, "w", closefd=False)
    # Line buffering: whole lines reach the pipe as they are printed (live output), and a
    # line is one write, so the relay never sees a print split across reads mid-word needlessly.
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _retarget_logging(old_streams: set[int] | None) -> None:
    """Handlers created in the kernel still hold its streams; point them at the rank's.

    The kernel lists them before each fork (``prepare``): a rank walking every live handler, or
    every logger, would copy their memory pages into itself (copy-on-write). A rank started
    without that list (spawn) walks logging's own list of live handlers.
    """
    refs = _KERNEL_STREAM_HANDLERS if _KERNEL_STREAM_HANDLERS is not None else _stream_handlers(old_streams or set())
    for ref in refs:
        handler = ref()
        if handler is None:
            continue
        try:
            handler.stream = sys.stderr  # a StreamHandler: checked when listed
        except AttributeError:  # logging's last-resort handler reads sys.stderr by itself
            pass


def _stream_handlers(streams: set[int]) -> list[weakref.ref[Any]]:
    """logging's own weak references to the live handlers writing to one of ``streams`` (by id)."""
    found = []
    for ref in list(getattr(logging, "_handlerList", [])):
        handler = ref()
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in streams:
            found.append(ref)
    return found


# logging's weak references to the kernel's handlers on its stdout/stderr, listed before each
# fork (weak: the kernel's handlers are not kept alive by this list).
_KERNEL_STREAM_HANDLERS: list[weakref.ref[Any]] | None = None


def flush_all() -> None:
    """Flush Python's and C's buffered output; called right before the rank exits."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _libc is not None:
        _libc.fflush(None)


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=prepare)
