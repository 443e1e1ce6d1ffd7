"""The fork server's messages: pickled dicts, with fds, on the socketpair of the kernel and its fork server.

Both ends use these (the kernel's handle, ``nbaccel.launch.starters.fork_server``, and the
server's loop, ``nbaccel.rank.server_loop``, which lists the messages). The socketpair is private to
the kernel and its own child, as the event pipes are: nothing read here came from a network.

Example:
    >>> import socket
    >>> a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    >>> send_message(a, {"op": "exit", "pid": 7, "code": 0})
    >>> recv_message(b)
    ({'op': 'exit', 'pid': 7, 'code': 0}, [])
    >>> a.close(); b.close()
"""

from __future__ import annotations

import os
import pickle
import socket
from typing import Any

MAX_MESSAGE = 1 << 20  # a request's dict: the kernel's environment, sys.path and a few module names
MAX_FDS = 8


def recv_message(sock: socket.socket) -> tuple[dict[str, Any] | None, list[int]]:
    """One message and the fds passed with it; (None, []) at end of file."""
    data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    if not data:
        for fd in fds:
            os.close(fd)
        return None, []
    message: dict[str, Any] = pickle.loads(data)  # from our own parent or child, over a private socketpair
    return message, list(fds)


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """``message`` and ``fds`` in one datagram."""
    socket.send_fds(sock, [pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)], fds or [])
