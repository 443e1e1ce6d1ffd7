"""The launch's rendezvous store, hosted by the kernel and listening on loopback only.

torch's TCPStore listens on every interface even when given 127.0.0.1, but it accepts a socket
that is already bound and listening (``master_listen_fd``). Workers attach to it as clients
(``TORCHELASTIC_USE_AGENT_STORE=True``), so ``init_process_group()`` with ``env://`` works in
user code as in any DDP script. A fresh store on a fresh port per attempt means no stale keys
from an earlier launch can ever be read.

Example:
    >>> rdzv = LoopbackRendezvous()
    >>> rdzv.port > 0
    True
    >>> rdzv.start_store(world_size=2)
    >>> rdzv.close()
"""

from __future__ import annotations

import datetime
import errno
import ipaddress
import socket
from typing import Any

from nbaccel.errors import EngineStateError, PreflightError


def is_loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def address_towards(host: str, port: int) -> str | None:
    """This machine's address on the route to ``host`` (a UDP connect sends nothing), or None.

    >>> address_towards("127.0.0.1", 29500)
    '127.0.0.1'
    """
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
    except OSError:  # no route, or a name that does not resolve
        return None


class LoopbackRendezvous:
    """Reserves a loopback port at once; starts the TCPStore on it when asked."""

    def __init__(self, address: str = "127.0.0.1", port: int | None = None) -> None:
        self.address = "127.0.0.1" if address == "localhost" else address
        self._socket: socket.socket | None = _listen(self.address, port or 0)
        self.port: int = self._socket.getsockname()[1]
        self._store: Any = None
        self._store_fd: int | None = None

    @property
    def listen_fd(self) -> int | None:
        """The listening socket's fd while the kernel still holds it (ranks must close it)."""
        return self._socket.fileno() if self._socket is not None else None

    @property
    def child_closes(self) -> tuple[int, ...]:
        """The store's listening fd once the store owns it: a rank forked after that closes it."""
        return () if self._store_fd is None or self._store is None else (self._store_fd,)

    @property
    def store(self) -> Any:
        """The TCPStore served here (None before ``start_store``): the kernel's own client of it."""
        return self._store

    def start_store(self, world_size: int, timeout: float = 300.0) -> None:
        """Serve the store on the reserved socket. Ranks that connected earlier wait in its backlog."""
        from torch.distributed import TCPStore  # type: ignore[attr-defined]  # exported at run time only

        if self._socket is None:
            raise EngineStateError("the rendezvous store was started twice, or after the rendezvous closed")
        fd = self._socket.detach()  # the store owns (and closes) the fd from here on
        self._socket = None
        self._store_fd = fd
        self._store = TCPStore(
            self.address,
            self.port,
            world_size,
            True,
            datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
            master_listen_fd=fd,
        )

    @property
    def store_started(self) -> bool:
        return self._store is not None

    def close(self) -> None:
        self._store = None  # the last reference: the server thread stops and the port is freed
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _listen(address: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Lets use_port be reused at once after a launch, while old connections sit in TIME_WAIT.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PreflightError(
                f"port {port} on {address} is already in use, so the ranks could not rendezvous there; "
                "pass another use_port, or leave use_port=None to let nbaccel pick a free one."
            ) from None
        raise
    sock.set_inheritable(False)
    return sock
