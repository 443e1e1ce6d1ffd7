"""One authenticated TCP connection between the kernel and a node agent, from either end.

The handshake makes a session both ends contributed to, so that nothing recorded from an earlier
connection can be replayed into this one::

    kernel -> agent   hello   (session "K")       signed: the agent learns the kernel has the secret
    agent  -> kernel  join    (session "K.A")     signed: the kernel learns the agent has it
    ...every later message, both ways, carries session "K.A" and a rising sequence number

Frames that fail verification after the handshake are dropped and counted (``refused``), never
decoded; before it, the first bad frame ends the connection.

Example::

    link = Link(sock, secret, sender="kernel")
    link.send("heartbeat")
    for message in link.receive():   # verified messages only
        ...
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import socket
import threading
from typing import Any

from nbaccel.net.signing import FrameReader, Message, RefusedMessage, Signer, Verifier

log = logging.getLogger("nbaccel.cluster")

_MAX_PAYLOAD_BEFORE_JOIN = 1 << 16  # an unauthenticated peer cannot make us buffer much
_MAX_PAYLOAD = 1 << 34
SEND_TIMEOUT = 10.0


def cluster_id(secret: bytes) -> str:
    """A public name for the cluster derived from its secret (reveals nothing about it)."""
    return hmac.new(secret, b"nbaccel cluster id", hashlib.sha256).hexdigest()[:16]


def new_nonce() -> str:
    return secrets.token_hex(16)


class Link:
    """A connected socket with signed framing; sends are thread-safe, receives are not."""

    def __init__(self, sock: socket.socket, secret: bytes, sender: str, session: str = "") -> None:
        self.sock = sock
        self.sock.settimeout(SEND_TIMEOUT)
        self.cluster = cluster_id(secret)
        self.signer = Signer(secret, self.cluster, sender, session)
        self.verifier = Verifier(secret, self.cluster, session or None)
        self.reader = FrameReader(_MAX_PAYLOAD_BEFORE_JOIN)
        self.authenticated = False
        self.refused = 0
        self.peer = _peer_name(sock)
        self._send_lock = threading.Lock()

    def fileno(self) -> int:
        return self.sock.fileno()

    def start_session(self, session: str) -> None:
        """Both ends agreed on ``session``: everything from now on must carry it."""
        self.signer.session = session
        self.verifier.session = session
        self.authenticated = True
        self.reader.max_payload = _MAX_PAYLOAD

    def send(self, kind: str, body: Any = None, launch: str | None = None, raw: bytes | None = None) -> None:
        """Seal and send one message (blocks up to SEND_TIMEOUT; OSError if the peer is gone)."""
        with self._send_lock:
            self.sock.sendall(self.signer.seal(kind, body, launch, raw))

    def receive(self) -> list[Message]:
        """Verified messages in what the socket holds now; EOFError when it is closed.

        Call only when the socket is readable (it is blocking: a recv would wait otherwise).
        """
        try:
            chunk = self.sock.recv(1 << 20)
        except (ConnectionError, TimeoutError, OSError) as exc:
            raise EOFError(str(exc)) from None
        if not chunk:
            raise EOFError("closed by the peer")
        try:
            frames = self.reader.feed(chunk)
        except RefusedMessage as exc:
            raise EOFError(f"malformed stream from {self.peer}: {exc}") from None
        return [m for m in (self._verify(f) for f in frames) if m is not None]

    def _verify(self, frame: bytes) -> Message | None:
        try:
            return self.verifier.open(frame)
        except RefusedMessage as exc:
            self.refused += 1
            if not self.authenticated:
                raise EOFError(str(exc)) from None
            log.warning("nbaccel: dropped a message from %s: %s", self.peer, exc)
            return None

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _peer_name(sock: socket.socket) -> str:
    try:
        name = sock.getpeername()
    except OSError:
        return "?"
    return f"{name[0]}:{name[1]}" if isinstance(name, tuple) else str(name or "local")


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv6 host in brackets or not) as ``(host, port)``.

    Example:
        >>> split_address("[fd00::1]:29400")
        ('fd00::1', 29400)
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT; pass the address the cluster printed (cluster.address).")
    return host.strip("[]"), int(port)
