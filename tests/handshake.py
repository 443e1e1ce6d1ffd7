"""Handshakes between a test and its ranks: wait for what happened, never "long enough".

A rank (or the test) says it reached a point by creating a marker file; the other side waits
for the file, in short polls, up to a bound. Where the point is "blocked inside a C call" (a
collective whose peer never comes, a native sleep), the rank cannot say so itself once there:
it marks the moment before the call with its pid, and the waiter then watches that thread's
scheduler state in ``/proc`` until the kernel has put it to sleep.

Example::

    # in rank 0                                   # in rank 1
    mark(path)                                    wait_until_blocked(path)
    dist.all_reduce(t)  # blocks: rank 1 never    raise ValueError("boom")  # rank 0 is in it
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nbaccel.testing import CollectingSink

_POLL_S = 0.01
_ASLEEP_READS = 3  # consecutive reads that see the thread asleep: not a passing lock wait


def mark(path: str | os.PathLike[str], text: str | None = None) -> None:
    """Create the marker ``path`` holding ``text`` (default this process's pid), whole when it
    appears (renamed in)."""
    partial = f"{os.fspath(path)}.{os.getpid()}.partial"
    with open(partial, "w") as handle:
        handle.write(str(os.getpid()) if text is None else text)
    os.replace(partial, path)


def wait_for(*paths: str | os.PathLike[str], timeout: float = 30.0) -> None:
    """Return once every marker in ``paths`` exists; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(p) for p in paths):
        if time.monotonic() > deadline:
            missing = [os.fspath(p) for p in paths if not os.path.exists(p)]
            raise TimeoutError(f"no marker {missing} within {timeout} s")
        time.sleep(_POLL_S)


def wait_until_blocked(path: str | os.PathLike[str], timeout: float = 30.0) -> int:
    """Wait for the marker ``path``, then until its process's main thread sleeps in the kernel
    (state S, several reads in a row): it has entered the blocking call it marked just before.
    Returns the pid. Only the main thread is looked at; the call must come right after ``mark``
    with nothing on the way that sleeps (the rank runs no other Python thread that could hold
    the GIL)."""
    wait_for(path, timeout=timeout)
    pid = int(Path(path).read_text())
    deadline = time.monotonic() + timeout
    asleep = 0
    while asleep < _ASLEEP_READS:
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not block within {timeout} s after its marker {os.fspath(path)!r}")
        asleep = asleep + 1 if thread_state(pid) == "S" else 0
        time.sleep(_POLL_S)
    return pid


def thread_state(pid: int, tid: int | None = None) -> str:
    """The scheduler state letter of a thread (default the main one): R running, S asleep, ..."""
    stat = Path(f"/proc/{pid}/task/{tid or pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]  # the command name, in parentheses, may hold spaces


class MarkWhen(CollectingSink):
    """A collecting sink that creates ``marker`` once ``condition(self)`` holds after a line or an
    event arrived: the ranks learn what the kernel saw (a sample, a line of every rank)."""

    def __init__(self, marker: str | os.PathLike[str], condition: Callable[[CollectingSink], bool]) -> None:
        super().__init__()
        self.marker, self.condition, self.marked = marker, condition, False

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        super().output(rank, stream, lines)
        self._check()

    def event(self, rank: int, event: dict[str, Any]) -> None:
        super().event(rank, event)
        self._check()

    def _check(self) -> None:
        if not self.marked and self.condition(self):
            self.marked = True
            mark(self.marker)


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def grow_until_sampled(asked: str, seen: str, grow: int = 64 * 2**20) -> bytearray:
    """In a rank: touch ``grow`` more bytes, say in ``asked`` how many resident bytes only a later
    sample can show, and wait until the kernel's sink saw such a sample (``seen``, made by
    ``MarkWhen(seen, sampled_above(rank, asked))``). A sample that shows the growth was read
    after it, so after whatever the rank did before growing (moving into a cgroup)."""
    held = bytearray(b"x" * grow)
    mark(asked, str(resident_bytes() - grow // 2))  # above any sample from before the growth
    wait_for(seen)
    return held


def sampled_above(rank: int, asked: str | os.PathLike[str]) -> Callable[[CollectingSink], bool]:
    """The condition: a resources sample of ``rank`` shows the resident bytes ``asked`` holds."""

    def holds(sink: CollectingSink) -> bool:
        if not os.path.exists(asked):
            return False
        floor = int(Path(asked).read_text())
        return any(e.get("type") == "resources" and (e.get("rss") or 0) >= floor for e in sink.events.get(rank, []))

    return holds


class InterruptOnceAllSay(CollectingSink):
    """Interrupts the kernel (this process's main thread, with a real SIGINT, as the stop button
    does) once each of ``ranks`` printed a line holding ``word``: an event, not a guess of how long
    starting takes. ``sent_at`` is when (monotonic), None until then."""

    def __init__(self, word: str, ranks: int = 2) -> None:
        super().__init__()
        self.word, self.expected = word, ranks
        self.sent_at: float | None = None

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        super().output(rank, stream, lines)
        if self.sent_at is None and all(any(self.word in line for line in self.text(r)) for r in range(self.expected)):
            self.sent_at = time.monotonic()
            signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
