"""The event stream's decoder: every split of the stream decodes the same, big payloads are not copied.

Imports internals (errors, wire): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import threading
import time
import tracemalloc

import pytest

from nbaccel.errors import FrameError
from nbaccel.wire import events


def frames(*payloads: bytes) -> bytes:
    return b"".join(events.encode_header(events.Kind.RICH, len(p)) + p for p in payloads)


@pytest.mark.parametrize("step", [1, 3, 10, 11, 4096])
def test_any_split_of_the_stream_decodes_the_same(step: int) -> None:
    stream = frames(b"", b"a", b"x" * 5000, b"tail")
    decoder, got = events.FrameDecoder(), []
    for at in range(0, len(stream), step):
        got += decoder.feed(stream[at : at + step])
    assert [bytes(e.payload) for e in got] == [b"", b"a", b"x" * 5000, b"tail"]
    assert decoder.pending == 0


def test_a_frame_of_another_version_is_refused() -> None:
    with pytest.raises(FrameError, match="format version 9"):
        events.FrameDecoder().feed(b"\x09\x01" + b"\0" * 8)


def test_a_big_payload_is_read_into_its_one_buffer() -> None:
    size = 64 << 20
    payload = os.urandom(1 << 20) * 64
    r, w = os.pipe()
    os.set_blocking(r, False)
    writer = threading.Thread(target=lambda: (os.write(w, events.encode_header(events.Kind.RESULT, size)), events._write_all(w, payload)))
    decoder, got = events.FrameDecoder(), []
    tracemalloc.start()
    try:
        writer.start()
        while not got:
            import select

            select.select([r], [], [], 5)
            more, open_ = decoder.read_from(r)
            got += more
            assert open_
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        writer.join()
        os.close(r)
        os.close(w)
    assert isinstance(got[0].payload, bytearray) and got[0].payload == payload
    assert peak < 1.1 * size  # the payload's buffer and one read's chunk, no copies of the whole


def test_end_of_file_is_reported() -> None:
    r, w = os.pipe()
    os.write(w, frames(b"last"))
    os.close(w)
    decoder = events.FrameDecoder()
    assert [bytes(e.payload) for e in decoder.read_from(r)[0]] == [b"last"]
    assert decoder.read_from(r) == ([], False)
    os.close(r)


def test_an_interrupt_another_thread_takes_while_a_frame_is_written_still_waits_for_the_whole_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank running torch has threads that do not block SIGINT (OpenMP's, gloo's): the kernel
    may hand them the signal, and Python still raises KeyboardInterrupt on the main thread."""
    import signal
    import threading

    read_end, write_end = os.pipe()
    real_write = os.write
    other_thread_up, stop = threading.Event(), threading.Event()
    sent: list[bool] = []

    def other_thread() -> None:  # SIGINT unblocked here whatever the main thread's mask says
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        other_thread_up.set()
        stop.wait(10)

    def write_then_interrupt(fd: int, data: bytes) -> int:
        written = real_write(fd, data)
        if not sent:  # between the header and the payload
            sent.append(True)
            signal.pthread_kill(thread.ident or 0, signal.SIGINT)  # taken by the other thread
            deadline = time.monotonic() + 10
            while getattr(signal.getsignal(signal.SIGINT), "caught", None) is None and time.monotonic() < deadline:
                time.sleep(0.001)  # the main thread runs Python's handler here: a raise would come now
        return written

    thread = threading.Thread(target=other_thread, name="not-blocking-sigint")
    thread.start()
    try:
        assert other_thread_up.wait(10)
        monkeypatch.setattr(events, "_ONE_WRITE_BELOW", 0)  # two writes, as for a big payload
        monkeypatch.setattr(events.os, "write", write_then_interrupt)
        with pytest.raises(KeyboardInterrupt):
            events.send_bytes(write_end, events.Kind.RESULT, b"y" * 1000)
        monkeypatch.undo()
        frames = list(events.FrameDecoder().feed(os.read(read_end, 4096)))
        assert [(f.kind, bytes(f.payload)) for f in frames] == [(events.Kind.RESULT, b"y" * 1000)]
    finally:
        stop.set()
        thread.join(10)
        os.close(read_end)
        os.close(write_end)


def test_a_frame_written_with_sigint_ignored_leaves_it_ignored() -> None:
    import signal

    read_end, write_end = os.pipe()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        events.send_bytes(write_end, events.Kind.RESULT, b"z")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert [bytes(f.payload) for f in events.FrameDecoder().feed(os.read(read_end, 4096))] == [b"z"]
    finally:
        signal.signal(signal.SIGINT, previous)
        os.close(read_end)
        os.close(write_end)


def test_an_interrupt_while_a_frame_is_written_waits_until_the_frame_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """SIGINT held back on the main thread: the frame is whole, then KeyboardInterrupt comes."""
    import signal

    read_end, write_end = os.pipe()
    real_write = os.write

    def write_then_interrupt(fd: int, data: bytes) -> int:
        written = real_write(fd, data)
        os.kill(os.getpid(), signal.SIGINT)  # between the header and the payload
        return written

    monkeypatch.setattr(events, "_ONE_WRITE_BELOW", 0)  # two writes, as for a big payload
    monkeypatch.setattr(events.os, "write", write_then_interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            events.send_bytes(write_end, events.Kind.RESULT, b"x" * 1000)
        monkeypatch.undo()
        decoder = events.FrameDecoder()
        frames = list(decoder.feed(os.read(read_end, 4096)))
        assert [(f.kind, bytes(f.payload)) for f in frames] == [(events.Kind.RESULT, b"x" * 1000)]
    finally:
        os.close(read_end)
        os.close(write_end)
