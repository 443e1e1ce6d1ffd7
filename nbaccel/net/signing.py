"""Signed messages between the kernel and its node agents: a JSON header, payload bytes, an HMAC.

Everything that crosses a network between nbaccel's processes is one of these. A message is::

    b"NBA1" | header length (4 bytes) | payload length (8 bytes) | header (JSON) | payload | MAC

where MAC = HMAC-SHA256(secret, everything before it). The header names the cluster, the
session (a nonce from each end of one connection), the launch (or None), the kind of message,
its sender and a sequence number. ``Verifier.open`` checks the MAC in constant time and then the
header; only a message that passed may have its payload decoded, and only then may a payload be
unpickled. A replayed message (a sequence number already seen), one from another session, cluster
or launch, or one whose MAC does not match is refused with ``RefusedMessage``.

Example:
    >>> secret = new_secret()
    >>> signer = Signer(secret, cluster="c1", sender="kernel", session="k.a")
    >>> wire = signer.seal("heartbeat", {"t": 1})
    >>> message = Verifier(secret, cluster="c1", session="k.a").open(wire)
    >>> message.kind, message.json()
    ('heartbeat', {'t': 1})
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import stat
import struct
import tempfile
from dataclasses import dataclass
from typing import Any

SECRET_BYTES = 32
MAGIC = b"NBA1"
_PREFIX = struct.Struct("!4sIQ")
MAC_BYTES = hashlib.sha256().digest_size
MAX_HEADER = 1 << 16
TOKEN_ENV = "NBACCEL_TOKEN"


class RefusedMessage(Exception):
    """A message that failed authentication or freshness; its payload was never decoded."""


def new_secret() -> bytes:
    """32 random bytes from the OS's cryptographic generator."""
    return secrets.token_bytes(SECRET_BYTES)


def private_token_dir(directory: str | None = None) -> str:
    """The folder for token files: ``directory`` (made 0700 if missing), by default ``~/.nbaccel/clusters``.

    A home directory is usually the filesystem a cluster's nodes share, so the agents can read
    the file where the kernel wrote it; the default folder is kept at mode 0700 and every token
    file is 0600 wherever it is. ``tempfile.gettempdir()`` keeps the token on this machine only.

    Example:
        >>> import tempfile
        >>> private_token_dir(tempfile.gettempdir()) == tempfile.gettempdir()
        True
    """
    default = os.path.expanduser(os.path.join("~", ".nbaccel", "clusters"))
    folder = os.path.expanduser(directory) if directory is not None else default
    os.makedirs(folder, mode=0o700, exist_ok=True)
    if folder == default and stat.S_IMODE(os.stat(folder).st_mode) & 0o077:
        os.chmod(folder, 0o700)  # made under a loose umask (or by hand): close it before a secret goes in
    return folder


def write_token_file(secret: bytes, directory: str | None = None) -> str:
    """Write ``secret`` (hex) to a new file only its owner may read; returns the path.

    The file is created with mode 0600 from the start (``mkstemp``), never widened afterwards.
    """
    fd, path = tempfile.mkstemp(prefix="nbaccel-cluster-", suffix=".token", dir=directory)
    try:
        os.fchmod(fd, stat.S_IRUSR | stat.S_IWUSR)
        os.write(fd, secret.hex().encode() + b"\n")
    finally:
        os.close(fd)
    return path


def parse_token(text: str, where: str) -> bytes:
    """The secret written in ``text`` (64 hex digits); ValueError naming ``where`` otherwise."""
    try:
        secret = bytes.fromhex(text.strip())
    except ValueError:
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise ValueError(
            f"the cluster token from {where} is not {SECRET_BYTES * 2} hex digits, so it cannot "
            "authenticate this node. Copy the cluster's token file (cluster.token_file) unchanged."
        )
    return secret


def read_token(path: str | None, environ: dict[str, str] | None = None) -> bytes:
    """The secret from the token file at ``path``, else from ``$NBACCEL_TOKEN``."""
    environ = dict(os.environ) if environ is None else environ
    if path:
        with open(path, encoding="ascii") as handle:
            return parse_token(handle.read(), repr(path))
    if environ.get(TOKEN_ENV):
        return parse_token(environ[TOKEN_ENV], f"${TOKEN_ENV}")
    raise ValueError(
        "no cluster token: the agent needs the cluster's secret to join. Pass --token-file PATH "
        f"(a copy of cluster.token_file) or set {TOKEN_ENV} to its contents."
    )


@dataclass(frozen=True)
class Message:
    """A message that passed verification."""

    header: dict[str, Any]
    payload: bytes

    @property
    def kind(self) -> str:
        return str(self.header["kind"])

    @property
    def launch(self) -> str | None:
        return self.header.get("launch")

    @property
    def sender(self) -> str:
        return str(self.header["sender"])

    def json(self) -> Any:
        """The payload as JSON (control messages)."""
        return json.loads(self.payload) if self.payload else None


class Signer:
    """Seals outgoing messages for one connection, numbering them."""

    def __init__(self, secret: bytes, cluster: str, sender: str, session: str) -> None:
        self._key = secret
        self.cluster = cluster
        self.sender = sender
        self.session = session
        self._sequence = 0

    def seal(self, kind: str, body: Any = None, launch: str | None = None, raw: bytes | None = None) -> bytes:
        """One message: ``raw`` bytes as the payload, else ``body`` as JSON."""
        self._sequence += 1
        header = {
            "cluster": self.cluster,
            "session": self.session,
            "launch": launch,
            "kind": kind,
            "sender": self.sender,
            "seq": self._sequence,
        }
        payload = raw if raw is not None else (b"" if body is None else json.dumps(body).encode())
        return seal(self._key, header, payload)


def seal(key: bytes, header: dict[str, Any], payload: bytes) -> bytes:
    """Frame and sign ``header`` and ``payload`` (no freshness bookkeeping)."""
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    body = _PREFIX.pack(MAGIC, len(header_bytes), len(payload)) + header_bytes + payload
    return body + hmac.new(key, body, hashlib.sha256).digest()


class Verifier:
    """Checks incoming messages of one connection: MAC first, then cluster, session and order."""

    def __init__(self, secret: bytes, cluster: str, session: str | None) -> None:
        self._key = secret
        self.cluster = cluster
        self.session = session  # None: accept one (the first message of a connection names it)
        self._last_sequence: dict[str, int] = {}

    def open(self, wire: bytes) -> Message:
        """The verified message in ``wire`` (one whole frame), or RefusedMessage."""
        if len(wire) < _PREFIX.size + MAC_BYTES:
            raise RefusedMessage("truncated message")
        magic, header_len, payload_len = _PREFIX.unpack_from(wire)
        if magic != MAGIC or len(wire) != _PREFIX.size + header_len + payload_len + MAC_BYTES:
            raise RefusedMessage("not an nbaccel message")
        body, mac = wire[:-MAC_BYTES], wire[-MAC_BYTES:]
        expected = hmac.new(self._key, body, hashlib.sha256).digest()
        if not hmac.compare_digest(mac, expected):
            raise RefusedMessage("bad signature (wrong cluster token, or altered on the way)")
        start = _PREFIX.size
        header = json.loads(body[start : start + header_len])
        self._check_header(header)
        return Message(header, bytes(body[start + header_len :]))

    def _check_header(self, header: dict[str, Any]) -> None:
        if header.get("cluster") != self.cluster:
            raise RefusedMessage(f"message for another cluster ({header.get('cluster')!r})")
        if self.session is not None and header.get("session") != self.session:
            raise RefusedMessage("message from another session (a replay from an earlier connection)")
        sender, sequence = str(header.get("sender")), header.get("seq")
        if not isinstance(sequence, int) or sequence <= self._last_sequence.get(sender, 0):
            raise RefusedMessage(f"replayed or reordered message (sequence {sequence!r} from {sender!r})")
        self._last_sequence[sender] = sequence


class FrameReader:
    """Cuts whole frames out of a byte stream (before verification: sizes are bounded)."""

    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[bytes]:
        """Whole frames completed by ``chunk``; RefusedMessage on a malformed or oversized one."""
        self._buffer += chunk
        frames = []
        while len(self._buffer) >= _PREFIX.size:
            magic, header_len, payload_len = _PREFIX.unpack_from(self._buffer)
            if magic != MAGIC or header_len > MAX_HEADER or payload_len > self.max_payload:
                raise RefusedMessage("malformed or oversized frame")
            end = _PREFIX.size + header_len + payload_len + MAC_BYTES
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[:end]))
            del self._buffer[:end]
        return frames
