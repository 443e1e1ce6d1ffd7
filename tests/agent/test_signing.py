"""The signed transport, unit level: only authentic, fresh messages are ever decoded.

Imports internals (net.link, net.signing): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import pickle
import socket
import stat

import pytest

from nbaccel.net.link import Link, cluster_id
from nbaccel.net.signing import (
    FrameReader,
    RefusedMessage,
    Signer,
    Verifier,
    new_secret,
    parse_token,
    read_token,
    seal,
    write_token_file,
)
from tests.agent.harness import poison

pytestmark = pytest.mark.timeout(20)


def _pair(secret: bytes, session: str = "k.a") -> tuple[Signer, Verifier]:
    return Signer(secret, "c", "kernel", session), Verifier(secret, "c", session)


def _deliver(verifier: Verifier, wire: bytes) -> object:
    """What a receiver does: verify, then (only then) unpickle."""
    return pickle.loads(verifier.open(wire).payload)


def test_a_signed_message_opens_with_its_header_and_payload() -> None:
    signer, verifier = _pair(new_secret())
    message = verifier.open(signer.seal("lines", {"rank": 1}, launch="L"))
    assert (message.kind, message.launch, message.sender, message.json()) == ("lines", "L", "kernel", {"rank": 1})


def test_poison_is_never_unpickled_when_mis_signed_unsigned_or_replayed(tmp_path) -> None:
    secret = new_secret()
    target = tmp_path / "executed"
    signer, verifier = _pair(secret)
    good = signer.seal("frame", raw=poison(str(target)))
    other_key = Signer(new_secret(), "c", "kernel", "k.a").seal("frame", raw=poison(str(target)))
    tampered = bytearray(good)
    tampered[-40] ^= 1  # a payload byte
    unsigned = poison(str(target))
    for wire in (other_key, bytes(tampered), unsigned, good[:-32] + b"\0" * 32):
        with pytest.raises(RefusedMessage):
            _deliver(verifier, wire)
    assert not target.exists()
    _deliver(verifier, good)  # the genuine message, once: now it may run
    assert target.exists()
    target.unlink()
    with pytest.raises(RefusedMessage, match="replayed"):
        _deliver(verifier, good)
    assert not target.exists()


def test_messages_of_another_session_or_cluster_are_refused() -> None:
    secret = new_secret()
    old = Signer(secret, "c", "kernel", "k.old").seal("launch")
    with pytest.raises(RefusedMessage, match="session"):
        Verifier(secret, "c", "k.new").open(old)
    with pytest.raises(RefusedMessage, match="cluster"):
        Verifier(secret, "other", "k.old").open(old)


def test_sequence_numbers_must_rise() -> None:
    signer, verifier = _pair(new_secret())
    first, second = signer.seal("a"), signer.seal("b")
    verifier.open(second)
    with pytest.raises(RefusedMessage, match="replayed or reordered"):
        verifier.open(first)


def test_frame_reader_cuts_frames_and_bounds_sizes() -> None:
    secret = new_secret()
    wire = seal(secret, {"kind": "x"}, b"p" * 100)
    reader = FrameReader(max_payload=1000)
    assert reader.feed(wire[:10]) == [] and reader.feed(wire[10:] + wire) == [wire, wire]
    with pytest.raises(RefusedMessage, match="oversized"):
        FrameReader(max_payload=10).feed(wire)
    with pytest.raises(RefusedMessage, match="malformed"):
        FrameReader(max_payload=10).feed(b"GET / HTTP/1.1\r\n\r\n")


def test_token_file_is_private_and_round_trips(tmp_path) -> None:
    secret = new_secret()
    path = write_token_file(secret, str(tmp_path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert read_token(path, {}) == secret
    assert read_token(None, {"NBACCEL_TOKEN": secret.hex()}) == secret
    with pytest.raises(ValueError, match="--token-file"):
        read_token(None, {})
    with pytest.raises(ValueError, match="64 hex digits"):
        parse_token("abc", "'x'")


def test_link_drops_bad_frames_after_the_handshake_and_keeps_working(tmp_path) -> None:
    secret = new_secret()
    a, b = socket.socketpair()
    sender, receiver = Link(a, secret, "node", "s"), Link(b, secret, "kernel", "s")
    try:
        receiver.start_session("s")
        sender.start_session("s")
        target = tmp_path / "executed"
        a.sendall(seal(new_secret(), {"kind": "frame"}, poison(str(target))))
        sender.send("lines", {"n": 1})
        messages = receiver.receive()
        assert [m.json() for m in messages] == [{"n": 1}] and receiver.refused == 1
        assert not target.exists()
        assert cluster_id(secret) == receiver.cluster != cluster_id(new_secret())
    finally:
        sender.close()
        receiver.close()
