"""Wake when another process finishes a file in a folder: inotify, instead of looking again and again.

The kernel waits for answers ranks write as files (a rank's count of collectives, renamed into
place; NCCL's flight-recorder dump, written and closed). A ``FolderWatch`` made before the first
look wakes its waiter as soon as any file in the folder is closed after writing or renamed into it,
so a look that finds nothing is followed by a wait that cannot miss the answer. Where inotify is
missing (a seccomp profile, a filesystem without it) ``wait`` sleeps 10 ms: the old poll.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with FolderWatch(folder) as watch:
    ...     with open(os.path.join(folder, "answer"), "w") as file:
    ...         _ = file.write("7")
    ...     watch.wait(5.0)
    True
    >>> os.remove(os.path.join(folder, "answer")); os.rmdir(folder)
"""

from __future__ import annotations

import ctypes
import os
import select
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self

_IN_CLOSE_WRITE = 0x00000008
_IN_MOVED_TO = 0x00000080
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = 0o2000000  # O_CLOEXEC on Linux
_FALLBACK_POLL = 0.01

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


class FolderWatch:
    """Files finished in ``folder`` from now on wake ``wait``; ``close`` (or ``with``) frees the fd."""

    def __init__(self, folder: str) -> None:
        self._fd = _watch(folder)

    def wait(self, timeout: float) -> bool:
        """Until a file in the folder is finished (True) or ``timeout`` seconds pass (False; with no
        inotify, True after at most 10 ms: look again)."""
        if self._fd is None:
            time.sleep(max(0.0, min(timeout, _FALLBACK_POLL)))
            return True
        ready, _, _ = select.select([self._fd], [], [], max(0.0, timeout))
        if not ready:
            return False
        try:
            while os.read(self._fd, 4096):  # the events themselves say nothing the caller needs
                pass
        except BlockingIOError:
            pass
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _watch(folder: str) -> int | None:
    init = getattr(_libc, "inotify_init1", None)
    add = getattr(_libc, "inotify_add_watch", None)
    if init is None or add is None:
        return None
    fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        return None
    if int(add(fd, os.fsencode(folder), _IN_CLOSE_WRITE | _IN_MOVED_TO)) < 0:
        os.close(fd)
        return None
    return fd
