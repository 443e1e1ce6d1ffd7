"""Handles on the rank processes nbaccel started: wait, signal and reap exactly those.

Each rank leads its own process group (so a signal reaches the DataLoader workers it started, and
nothing else), and is watched through a pidfd where Linux offers one, so the kernel waits on
events instead of polling.

Example:
    >>> pid = os.fork()
    >>> if pid == 0:
    ...     os._exit(3)
    >>> proc = RankProcess(rank=0, pid=pid)
    >>> proc.wait(timeout=5)
    3
    >>> proc.close()
"""

from __future__ import annotations

import os
import select
import signal
import time


class RankProcess:
    """One rank's process: pid, pidfd, exit status, and the signals nbaccel sent it."""

    def __init__(self, rank: int, pid: int) -> None:
        self.rank = rank
        self.pid = pid
        self.returncode: int | None = None  # exit code, or -signal number, once reaped
        self.signals_sent: list[int] = []
        self.pidfd: int | None = _open_pidfd(pid)

    def poll(self) -> int | None:
        """Reap the process if it has ended; its exit code (negative: killed by that signal)."""
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (someone's SIGCHLD handler): status unknown
                self.returncode = -signal.SIGKILL if self.signals_sent else 255
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self.pidfd is not None:
                select.select([self.pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.01))
        return self.returncode

    def send(self, sig: int) -> None:
        """Signal the rank's process group, only while the rank is not yet reaped.

        Until it is reaped, its pid (and so its pgid) cannot belong to anyone else.
        """
        if self.returncode is not None:
            return
        self.signals_sent.append(sig)
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            try:  # the group is gone (or was never made): the rank itself may still be there
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _open_pidfd(pid: int) -> int | None:
    opener = getattr(os, "pidfd_open", None)
    if opener is None:
        return None
    try:
        fd: int = opener(pid)
        return fd
    except OSError:  # kernels before 5.3, or seccomp profiles that forbid it
        return None
