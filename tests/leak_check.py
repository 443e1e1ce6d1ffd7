"""What a test must not leave behind: processes, zombies, threads, file descriptors, listening ports, /dev/shm files.

`Resources.now()` takes a cheap snapshot of this process (its descendants, its Python threads, its
open fds and the TCP ports it listens on); `leaks(before, after)` words every difference a test
is to blame for. tests/conftest.py compares a snapshot taken before each test with one taken
after it, so what a wider-scoped fixture holds (a module's kernel) is allowed.

The test process is made a child subreaper (`become_subreaper`): a process whose parent dies (a
rank of a killed kernel) is reparented to us, not to init, so it is still seen, and reaped.

Example:
    >>> before = Resources.now()
    >>> leaks(before, Resources.now())
    []
    >>> import threading; stop = threading.Event()
    >>> thread = threading.Thread(target=stop.wait, name="forgotten"); thread.start()
    >>> leaks(before, Resources.now())  # doctest: +ELLIPSIS
    ["thread 'forgotten' (...) still running"]
    >>> stop.set(); thread.join()
"""

from __future__ import annotations

import ctypes
import os
import socket
import threading
from dataclasses import dataclass

import psutil

_PR_SET_CHILD_SUBREAPER = 36
_LISTEN = "0A"
_KILLED_WAIT_S = 2.0  # the TCP state column of /proc/net/tcp{,6}


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux >= 3.4); whether it worked."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux: orphans go to init, as before
        return False


@dataclass(frozen=True)
class Descendant:
    pid: int
    ppid: int
    create_time: float
    zombie: bool
    name: str

    @property
    def key(self) -> tuple[int, float]:
        return (self.pid, self.create_time)  # a pid can be reused; pid + start time cannot

    def describe(self) -> str:
        return f"pid {self.pid} ({self.name})"


@dataclass(frozen=True)
class Resources:
    """What this process holds at one moment."""

    descendants: tuple[Descendant, ...]
    threads: frozenset[threading.Thread]
    fds: dict[int, str]  # fd -> what it points to ("socket:[123]", "/tmp/x", "pipe:[9]")
    listening: dict[str, int]  # inode of a socket of ours in TCP LISTEN state -> its port
    shm_files: frozenset[str] = frozenset()  # names in /dev/shm (the machine's: a test's new ones are its own)

    @staticmethod
    def now() -> Resources:
        fds = _open_fds()
        threads = frozenset(t for t in threading.enumerate() if t.is_alive())
        return Resources(_descendants(), threads, fds, _listening(fds), _shm_files())

    @property
    def ports(self) -> frozenset[int]:
        return frozenset(self.listening.values())

    def new_descendants(self, before: Resources) -> list[Descendant]:
        known = {d.key for d in before.descendants}
        return [d for d in self.descendants if d.key not in known]


def leaks(before: Resources, after: Resources, orphans_expected: bool = False) -> list[str]:
    """One line per thing ``after`` holds that ``before`` did not (what the test left behind).

    A zombie that is our child is either a process the test started and never waited for, or an
    orphan (reparented to us) that ended: with ``orphans_expected`` (a test that kills a parent on
    purpose) those are not counted. Zombies of other parents are always counted: a process the
    test started (a kernel) failed to wait for its child.
    """
    me = os.getpid()
    new = after.new_descendants(before)
    found = [f"process {d.describe()} still running" for d in new if not d.zombie]
    found += [f"zombie {d.describe()}: exited, never waited for by its parent pid {d.ppid}" for d in new if d.zombie and d.ppid != me]
    if not orphans_expected:
        found += [f"zombie {d.describe()}: our child, exited, never waited for" for d in new if d.zombie and d.ppid == me]
    found += [f"thread {t.name!r} ({'daemon' if t.daemon else 'not daemon'}) still running" for t in after.threads - before.threads]
    found += [f"listening on TCP port {port}" for port in sorted(after.ports - before.ports)]
    found += [f"/dev/shm/{name} left in shared memory" for name in sorted(after.shm_files - before.shm_files)]
    found += [
        f"fd {fd} -> {target} still open"
        for fd, target in sorted(after.fds.items())
        if before.fds.get(fd) != target and target[8:-1] not in after.listening  # a listening socket: its port says it
    ]
    return found


def clean_up(before: Resources, after: Resources) -> None:
    """Kill the processes the test left running and reap our zombies, so one leak does not cascade.

    Threads, fds and ports are left alone (closing an fd another object owns is worse than the
    leak); the next test's snapshot includes them, so they are reported once.
    """
    killed = []
    for descendant in after.new_descendants(before):
        if not descendant.zombie:
            try:
                process = psutil.Process(descendant.pid)
                process.kill()
                killed.append(process)
            except psutil.NoSuchProcess:
                pass
    psutil.wait_procs(killed, timeout=_KILLED_WAIT_S)  # reaps those that are our children
    reap_zombie_children()


def reap_zombie_children() -> list[int]:
    """Collect the exit status of every zombie child of ours (orphans that ended); their pids."""
    me, reaped = os.getpid(), []
    for child in psutil.Process().children():
        try:
            zombie = child.status() == psutil.STATUS_ZOMBIE and child.ppid() == me
            if zombie and os.waitpid(child.pid, os.WNOHANG)[0] == child.pid:
                reaped.append(child.pid)
        except (psutil.NoSuchProcess, ChildProcessError):  # reaped meanwhile by its owner
            pass
    return reaped


def _descendants() -> tuple[Descendant, ...]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            with child.oneshot():
                found.append(Descendant(child.pid, child.ppid(), child.create_time(), child.status() == psutil.STATUS_ZOMBIE, child.name()))
        except psutil.NoSuchProcess:
            pass
    return tuple(found)


def _open_fds() -> dict[int, str]:
    fds = {}
    for entry in os.listdir("/proc/self/fd"):
        try:
            fds[int(entry)] = os.readlink(f"/proc/self/fd/{entry}")
        except OSError:  # the fd listdir itself used, closed by now
            pass
    return fds


def _shm_files() -> frozenset[str]:
    try:
        return frozenset(os.listdir("/dev/shm"))
    except OSError:  # no /dev/shm on this system
        return frozenset()


def _listening(fds: dict[int, str]) -> dict[str, int]:
    """Socket inode -> port, for the TCP sockets among ``fds`` in LISTEN state (ours, not the machine's).

    Asked of each socket (SO_ACCEPTCONN on a duplicate of its fd): reading /proc/net/tcp costs
    ~10 ms per snapshot, as the kernel writes out every socket of the machine.
    """
    found: dict[str, int] = {}
    for fd, target in fds.items():
        if not target.startswith("socket:["):
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed meanwhile
            continue
        with sock:
            if (
                sock.family in (socket.AF_INET, socket.AF_INET6)
                and sock.type == socket.SOCK_STREAM
                and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
            ):
                found[target[8:-1]] = sock.getsockname()[1]
    return found
