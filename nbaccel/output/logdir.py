"""Full per-rank logs of a launch, in a folder of their own, keeping only the latest launches.

The widget view shows each rank's latest lines only; the whole output goes to
``<root>/<launch>/rank<N>.log``. ``root`` is ``$NBACCEL_LOG_DIR`` or the user's cache
(``$XDG_CACHE_HOME/nbaccel/logs``, else ``~/.cache/nbaccel/logs``). Each new launch removes the
oldest launch folders beyond ``keep`` (default 20), except folders a running launch holds (an
advisory lock on ``<launch>/.lock``), so a kernel that launches hundreds of times never fills
the disk, and two kernels never delete each other's live logs.

``RankLogSink`` is the sink that writes them: it sits beside the widget view (see
``nbaccel.output.choose``), which names the files it keeps.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> logs = LaunchLogs.create(root=root, keep=3)
    >>> logs.write(0, ["hello"])
    >>> logs.close()
    >>> (logs.path / "rank0.log").read_text()
    'hello\\n'
    >>> sink = RankLogSink(root=root)
    >>> sink.launch_started(2, attempt=0)
    >>> sink.output(1, "stdout", ["every line, however many"])
    >>> sink.launch_finished([])
    >>> sink.file_for(1).read_text()
    'every line, however many\\n'
    >>> shutil.rmtree(root)
"""

from __future__ import annotations

import itertools
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from nbaccel.launch.outcome import RankOutcome
from nbaccel.wire import rich

ENV_VAR = "NBACCEL_LOG_DIR"
DEFAULT_KEEP = 20
_LOCK_NAME = ".lock"
_counter = itertools.count(1)


def default_root() -> Path:
    """Where launch folders go unless told otherwise."""
    configured = os.environ.get(ENV_VAR)
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "nbaccel" / "logs"


class LaunchLogs:
    """One launch's log folder: one file per rank (and attempt), appended to as output comes."""

    def __init__(self, path: Path, lock_fd: int | None) -> None:
        self.path = path
        self._lock_fd = lock_fd
        self._files: dict[tuple[int, int], IO[str]] = {}
        self.attempt = 0

    @classmethod
    def create(cls, root: Path | None = None, keep: int = DEFAULT_KEEP) -> LaunchLogs | None:
        """A new launch folder under ``root`` (pruning old ones); None if it cannot be made.

        Logs are a convenience: a read-only home or a full disk must not stop a launch.
        """
        root = default_root() if root is None else Path(root)
        name = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{next(_counter)}"
        path = root / name
        try:
            root.mkdir(parents=True, exist_ok=True)
            lock_fd = _recycle(root, max(keep - 1, 0), path)
            if lock_fd is None:
                path.mkdir()
                lock_fd = os.open(path / _LOCK_NAME, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
                _flock(lock_fd)
        except OSError:
            return None
        return cls(path, lock_fd)

    def file_for(self, rank: int) -> Path:
        suffix = "" if self.attempt == 0 else f".attempt{self.attempt + 1}"
        return self.path / f"rank{rank}{suffix}.log"

    def write(self, rank: int, lines: list[str]) -> None:
        handle = self._handle(rank)
        if handle is not None:
            handle.write("".join(line + "\n" for line in lines))

    def flush(self) -> None:
        for handle in self._files.values():
            try:
                handle.flush()
            except OSError:
                pass

    def reopen(self, attempt: int) -> None:
        """Hold the folder again for a later attempt of a restarted launch (files of its own)."""
        self.close()
        self.attempt = attempt
        try:
            lock_fd = os.open(self.path / _LOCK_NAME, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o600)
            _flock(lock_fd)
        except OSError:
            return  # pruned meanwhile, or held: this attempt keeps no log
        self._lock_fd = lock_fd

    def close(self) -> None:
        for handle in self._files.values():
            try:
                handle.close()
            except OSError:
                pass
        self._files.clear()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the lock: the folder may be pruned from now on
            self._lock_fd = None

    def _handle(self, rank: int) -> IO[str] | None:
        key = (rank, self.attempt)
        handle = self._files.get(key)
        if handle is None and self._lock_fd is not None:
            try:  # kept open across writes (closed in close()): one open per rank, not per line
                handle = open(self.file_for(rank), "a", encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
            except OSError:
                return None
            self._files[key] = handle
        return handle


class RankLogSink:
    """The per-rank log tee of a launch: every line, and the text of every display, to its file.

    The first ``launch_started`` makes the launch folder (see ``LaunchLogs.create``), a later
    attempt reopens it with files of its own; ``launch_finished`` closes the files and lets the
    folder be pruned by later launches. No logs (a read-only home, a full disk) is no error.
    """

    def __init__(self, root: Path | str | None = None, keep: int = DEFAULT_KEEP) -> None:
        self.root = None if root is None else Path(root)
        self.keep = keep
        self.logs: LaunchLogs | None = None

    @property
    def folder(self) -> Path | None:
        """The launch folder, once the launch has started (None if it could not be made)."""
        return self.logs.path if self.logs is not None else None

    def file_for(self, rank: int) -> Path | None:
        """Rank ``rank``'s log file of the current attempt."""
        return self.logs.file_for(rank) if self.logs is not None else None

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        if self.logs is None:
            self.logs = LaunchLogs.create(self.root, keep=self.keep)
        else:
            self.logs.reopen(attempt)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        if self.logs is not None:
            self.logs.write(rank, lines)

    def event(self, rank: int, event: dict[str, Any]) -> None:
        text = rich.plain_text(event) if logs_event(event) else None
        if text and self.logs is not None:
            self.logs.write(rank, text.splitlines())

    def rank_finished(self, outcome: RankOutcome) -> None:
        pass

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        if self.logs is not None:
            self.logs.close()  # flushes; the folder may be pruned by later launches from now on

    def tick_in(self) -> float | None:
        return None

    def tick(self) -> None:
        pass


def logs_event(event: dict[str, Any]) -> bool:
    """Whether a rank's rich ``event`` goes into its log: a display, or a progress bar that ends and stays.

    Example:
        >>> logs_event({"type": rich.DISPLAY}), logs_event({"type": rich.STARTED, "pid": 7})
        (True, False)
    """
    kind = event.get("type")
    return bool(kind == rich.DISPLAY or (kind == rich.PROGRESS and event.get("closed") and event.get("leave", True)))


def prune(root: Path, keep: int) -> list[Path]:
    """Remove all but the ``keep`` newest launch folders under ``root`` that no launch holds."""
    removed = []
    for folder in _unkept(root, keep):
        if not _held(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _recycle(root: Path, keep: int, into: Path) -> int | None:
    """Prune as ``prune`` does, but make the oldest folder no launch holds the new launch's
    ``into`` instead of removing it (emptied, its lock taken first so no other kernel prunes it
    meanwhile): removing a folder costs about 2 ms on ext4, renaming one 15 us. The lock's fd, or
    None when no folder was old enough (the caller makes a new one)."""
    lock_fd = None
    for folder in _unkept(root, keep):
        if lock_fd is None:
            lock_fd = _take_over(folder, into)
            if lock_fd is not None:
                continue
        if not _held(folder):
            shutil.rmtree(folder, ignore_errors=True)
    return lock_fd


def _unkept(root: Path, keep: int) -> list[Path]:
    """The launch folders under ``root`` beyond the ``keep`` newest, newest first."""
    found = []  # os-level calls, not pathlib: this runs at every launch and every cell on workers
    try:
        with os.scandir(root) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False) and os.path.exists(os.path.join(entry.path, _LOCK_NAME)):
                    try:
                        found.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
                    except OSError:  # removed meanwhile by another kernel's prune
                        continue
    except OSError:
        return []
    found.sort(reverse=True)
    return [Path(path) for _, path in found[keep:]]


def _take_over(folder: Path, into: Path) -> int | None:
    """Lock ``folder`` (None if a launch holds it), rename it ``into`` and empty it but for its lock."""
    try:
        fd = os.open(folder / _LOCK_NAME, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        _flock(fd)
        os.rename(folder, into)
        os.utime(into)  # the newest now, whatever it held: the next prune keeps it
        with os.scandir(into) as entries:
            for entry in entries:
                if entry.name == _LOCK_NAME:
                    continue
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
    except OSError:
        os.close(fd)
        return None
    return fd


def _flock(fd: int) -> None:
    """An exclusive lock held without waiting (OSError if another holds it); POSIX only: fcntl is
    imported here so that importing nbaccel works on Windows (nbaccel.launch.platform)."""
    import fcntl

    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _held(folder: Path) -> bool:
    try:
        fd = os.open(folder / _LOCK_NAME, os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        _flock(fd)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops the probe's lock, if it got one
    return False
