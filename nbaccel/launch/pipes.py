"""Kernel side of the output pipeline: one rank's pipes, read without blocking, cut into lines.

The event loop owns the selector; a ``RankPipes`` turns whatever is readable into whole lines
and events, and keeps the rank's last lines for error reports.

Example:
    >>> parent, child = open_rank_pipes(rank=0)
    >>> _ = os.write(child.stdout, b"hello\\n")
    >>> seen = []
    >>> parent.read_stream(parent.stdout, "stdout", lambda rank, stream, lines: seen.extend(lines))
    True
    >>> seen
    ['hello']
    >>> parent.close(); close_child_ends(child)
"""

from __future__ import annotations

import collections
import os
import socket
from collections.abc import Callable
from typing import Any

from nbaccel.launch.lines import LineSplitter
from nbaccel.wire import events, shm
from nbaccel.wire.job import ChildEnds

LinesTo = Callable[[int, str, list[str]], None]  # (rank, stream, lines): where whole lines go

_READ_SIZE = 1 << 20
LAST_LINES = 20  # the output lines a failed rank's report quotes (a cluster's too)
_F_SETPIPE_SZ = 1031  # Linux: a bigger pipe means fewer wake-ups for chatty ranks and big results


class RankPipes:
    """The kernel's read ends of one rank's stdout, stderr and channel pipes."""

    def __init__(self, rank: int, stdout: int, stderr: int, channel_fd: int, commands: int | None = None, shared: shm.Mailbox | None = None) -> None:
        self.rank = rank
        self.stdout = stdout
        self.stderr = stderr
        self.channel = channel_fd
        self.commands = commands  # the write end of the rank's command pipe (persistent workers)
        self.shared = shared  # the kernel's end of the rank's fd socket: memfds of big values
        self.last_lines: collections.deque[str] = collections.deque(maxlen=LAST_LINES)
        self._splitters = {"stdout": LineSplitter(), "stderr": LineSplitter()}
        self._decoder = events.FrameDecoder(shared)

    @property
    def fds(self) -> list[int]:
        """The read ends the kernel watches."""
        return [self.stdout, self.stderr, self.channel]

    @property
    def all_fds(self) -> list[int]:
        return self.fds if self.commands is None else [*self.fds, self.commands]

    def read_stream(self, fd: int, stream: str, emit: LinesTo) -> bool:
        """Relay what ``fd`` holds now; False at end of file."""
        data = _read(fd)
        if data is None:
            return True
        if not data:
            return False
        lines = self._splitters[stream].feed(data)
        if lines:
            self.last_lines.extend(lines)
            emit(self.rank, stream, lines)
        return True

    def read_channel(self) -> tuple[list[events.Event], bool]:
        """Events complete so far, and False at end of file (a big payload is read in place)."""
        return self._decoder.read_from(self.channel, _READ_SIZE)

    def drain(self, emit: LinesTo) -> list[events.Event]:
        """Read everything left (the rank has exited); flush unterminated lines. The events left."""
        for fd, stream in ((self.stdout, "stdout"), (self.stderr, "stderr")):
            while self.read_stream(fd, stream, emit) and _readable(fd):
                pass
        frames = []
        while True:
            more, open_ = self.read_channel()
            frames.extend(more)
            if not open_ or not _readable(self.channel):
                break
        for stream, splitter in self._splitters.items():
            rest = splitter.flush()
            if rest:
                self.last_lines.extend(rest)
                emit(self.rank, stream, rest)
        return frames

    def close(self) -> None:
        for fd in self.all_fds:
            try:
                os.close(fd)
            except OSError:
                pass
        if self.shared is not None:
            self.shared.close()  # memfds posted but never unpickled go with it


def open_rank_pipes(rank: int, with_commands: bool = False, with_shared: bool = False) -> tuple[RankPipes, ChildEnds]:
    """One rank's pipes: stdout, stderr, channel (rank to kernel) and, for persistent workers,
    commands (kernel to rank); ``with_shared``, the fd socket beside them (nbaccel.wire.shm).
    Returns the kernel's ends (reads non-blocking) and the rank's."""
    ends: list[tuple[int, int]] = []
    shared: tuple[socket.socket, socket.socket] | None = None
    try:
        for size in (1 << 18, 1 << 16, 1 << 20):  # stdout, stderr, channel
            read_fd, write_fd = os.pipe()
            ends.append((read_fd, write_fd))
            os.set_blocking(read_fd, False)
            _grow_pipe(write_fd, size)
        if with_commands:
            ends.append(os.pipe())
        if with_shared:
            shared = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    except BaseException:
        for pair in ends:
            for fd in pair:
                os.close(fd)
        raise
    (out_r, out_w), (err_r, err_w), (chan_r, chan_w) = ends[:3]
    cmd_r, cmd_w = ends[3] if with_commands else (None, None)
    mailbox = shm.Mailbox(shared[0]) if shared is not None else None
    child_shared = shared[1].detach() if shared is not None else None
    return RankPipes(rank, out_r, err_r, chan_r, cmd_w, mailbox), ChildEnds(out_w, err_w, chan_w, cmd_r, child_shared)


def close_child_ends(ends: ChildEnds) -> None:
    for fd in (ends.stdout, ends.stderr, ends.channel, ends.commands, ends.shared):
        if fd is None:
            continue
        try:
            os.close(fd)
        except OSError:
            pass


def _grow_pipe(fd: int, size: int) -> None:
    try:
        import fcntl  # POSIX only: importing nbaccel works on Windows too (nbaccel.launch.platform)

        fcntl.fcntl(fd, _F_SETPIPE_SZ, size)
    except (OSError, AttributeError, ImportError):  # not Linux, or over the user's pipe quota: default size
        pass


def _read(fd: int) -> Any:
    """Bytes read, b"" at end of file, None if nothing is there right now."""
    try:
        return os.read(fd, _READ_SIZE)
    except BlockingIOError:
        return None


def _readable(fd: int) -> bool:
    import select

    return bool(select.select([fd], [], [], 0)[0])
