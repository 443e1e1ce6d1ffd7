"""One launch's messages, handed from the cluster's thread to the cell's event loop.

The engine's event loop waits on file descriptors; the inbox is a queue plus a pipe that is
readable while anything waits in it, so the loop wakes for network messages as it does for a
local rank's pipes, with no polling.

Example::

    inbox = LaunchInbox()
    inbox.put(("message", node, message))     # the cluster's thread
    inbox.take()                              # the loop, when inbox.fd is readable
"""

from __future__ import annotations

import os
import queue
import select
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbaccel.cluster.nodes import NodeInfo

Item = tuple[str, "NodeInfo", Any]  # ("message", node, verified Message) or ("lost", node, reason)


class LaunchInbox:
    """One launch's messages from the cluster's thread, with a pipe that is readable while any wait.

    The engine's event loop waits on file descriptors; ``fd`` lets it wait on this queue too.
    """

    def __init__(self) -> None:
        self.queue: queue.Queue[Item] = queue.Queue()
        self.fd, self._wake = os.pipe()
        os.set_blocking(self.fd, False)
        os.set_blocking(self._wake, False)
        self._lock = threading.Lock()  # the cluster's thread must never write to a closed (reused) fd
        self._closed = False

    def put(self, item: Item) -> None:
        with self._lock:
            if self._closed:
                return
            self.queue.put(item)
            try:
                os.write(self._wake, b"x")
            except BlockingIOError:  # full: the reader is behind and will look anyway
                pass

    def nudge(self) -> None:
        """Make ``fd`` readable again (items were set aside and still need the loop)."""
        with self._lock:
            if not self._closed:
                try:
                    os.write(self._wake, b"x")
                except BlockingIOError:
                    pass

    def take(self) -> list[Item]:
        """Everything waiting now (never blocks)."""
        try:
            while os.read(self.fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        items = []
        while True:
            try:
                items.append(self.queue.get_nowait())
            except queue.Empty:
                return items

    def wait(self, timeout: float) -> list[Item]:
        """What arrives within ``timeout`` seconds (outside an event loop)."""
        select.select([self.fd], [], [], max(0.0, timeout))
        return self.take()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self.fd)
            os.close(self._wake)
