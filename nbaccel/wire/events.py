"""The one event stream between a rank and the kernel: framed, versioned, encoded and decoded here.

Everything a rank tells the kernel (rich output, imports, ready, result, error, stacks) and every
command the kernel gives a persistent rank (task, stop) is one ``Event``: a kind and a payload.

Frame format (version 1), all integers big-endian::

    offset 0   1 byte   format version (1)
    offset 1   1 byte   kind (``Kind``)
    offset 2   8 bytes  payload length N
    offset 10  N bytes  payload: a pickle (cloudpickle where plain pickle cannot)

A reader that meets another version or an unknown kind raises ``FrameError`` rather than guess.
Locally the stream runs over a pipe private to one launch (created by the kernel, inherited only
by its own child), so nothing decoded here came from a network. A rank's stdout and stderr are
not framed locally: they are the raw file descriptors 1 and 2 (C libraries write there too), cut
into lines by the kernel; a node agent forwards those same lines as ``lines`` messages
(nbaccel.net.protocol), so the kernel's loop receives ``lines(rank, stream, lines)`` either way. Over a network every frame is
signed before anything is unpickled (nbaccel.agent).

Example:
    >>> r, w = os.pipe()
    >>> send(w, Kind.RESULT, {"loss": 0.5})
    >>> decoder = FrameDecoder()
    >>> [(event.kind.name, event.value()) for event in decoder.feed(os.read(r, 1024))]
    [('RESULT', {'loss': 0.5})]
    >>> os.close(r); os.close(w)
"""

from __future__ import annotations

import _signal
import enum
import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbaccel.errors import FrameError

if TYPE_CHECKING:
    from nbaccel.wire.shm import Attachments, Mailbox

VERSION = 1
_HEADER = struct.Struct("!BBQ")
# The heavy modules an IMPORTED event may name for the kernel to import (nbaccel.launch.warm): an
# allow-list, since an arbitrary module might initialise CUDA on import. DDP's first use in a rank
# imports torch._dynamo (about 800 modules); no public module of torch loads it (tests/test_torch_private.py).
WARM_MODULES = ("torch._dynamo",)

# A rank may send from several threads (a tqdm monitor, a logging thread): frames must not interleave.
_SEND_LOCK = threading.Lock()


class Kind(enum.IntEnum):
    RESULT = 1  # the rank's return value (of the launch, or of one task on a persistent worker)
    ERROR = 2  # a RemoteError's fields: the rank raised
    RICH = 3  # rich output for the sinks: a dict of nbaccel.wire.rich (display data, progress)
    READY = 4  # a persistent worker joined its process group and waits for tasks: {pid, device}
    TASK = 5  # kernel to worker: run this callable over the worker's namespace
    STOP = 6  # kernel to worker: leave the serve loop
    IMPORTED = 7  # heavy modules the rank had to import (nbaccel.launch.warm), for the kernel to preload
    # Output lines and stacks are no kinds: lines are raw fds 1/2 locally and the agent's `lines`
    # messages remotely (nbaccel.net.protocol); stacks are files written by faulthandler.
    # 8 and 9 were those kinds once: left unused, so an old node's frame is an unknown kind.
    PROMPT = 10  # a rank's debugger waits for a line: {prompt, text, where, header} (nbaccel.rank.debugger)
    DEBUG_OUTPUT = 11  # what a rank's debugger printed after its last prompt: {text}
    ANSWER = 12  # kernel to rank: the line typed at a PROMPT ({line}, {skip: reason}), or None: go on
    DEBUG_LEFT = 13  # a rank's debugger session ended (c, n, q, end of post-mortem): its turn may pass


@dataclass(frozen=True)
class Event:
    """One decoded frame: its kind, and its payload still pickled (decode with ``value()``)."""

    kind: Kind
    payload: bytes | bytearray  # a big payload is the buffer it was read into (no copy)
    mailbox: Mailbox | None = field(default=None, compare=False, repr=False)  # where its memfds come from

    def value(self) -> Any:
        return loads(self.payload, self.mailbox)


def dumps(value: Any, attached: Attachments | None = None) -> bytes:
    """Pickle ``value``, falling back to cloudpickle for lambdas and notebook-defined classes.

    Tensors on a GPU are moved to the CPU on the way: unpickling a CUDA tensor in the kernel
    would initialise CUDA there, and no later launch could fork. With ``attached``, tensors and
    arrays of 1 MiB or more go into memfds instead of the pickle (nbaccel.wire.shm).
    """
    on_gpu = _cuda_in_use()
    if attached is None and not on_gpu:
        try:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, AttributeError, TypeError):
            import cloudpickle  # only when plain pickle cannot: it is slower and imports more

            payload: bytes = cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
            return payload
    from nbaccel.wire import shm

    try:
        return shm.dumps(value, attached, to_cpu=on_gpu)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle

        if attached is not None:
            attached.close()  # memfds of the failed attempt: the second one makes its own
        return shm.dumps(value, attached, to_cpu=on_gpu, base=cloudpickle.Pickler)


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def loads(payload: bytes | bytearray, mailbox: Mailbox | None = None) -> Any:
    if mailbox is None:
        return pickle.loads(payload)
    from nbaccel.wire import shm

    return shm.loads(payload, mailbox)


def send(fd: int, kind: Kind, value: Any) -> None:
    """Write one frame (blocking). Raises whatever pickling raises, before writing anything."""
    send_bytes(fd, kind, dumps(value))


def send_bytes(fd: int, kind: Kind, payload: bytes | bytearray, defer_sigint: bool = True) -> None:
    """Write one frame. ``defer_sigint=False`` lets an interrupt stop a write that blocks (the
    kernel's side, which then treats the stream as broken).

    SIGINT is held back while a frame is written on the main thread: a KeyboardInterrupt half-way
    would corrupt the stream for every frame after it (persistent workers outlive interrupts).
    Held by a Python handler that only records it, not by masking the signal: a mask covers one
    thread, and a SIGINT that another thread takes (torch's OpenMP and gloo threads do not block
    it) still raises KeyboardInterrupt in the main thread between two bytecodes of the write.
    """
    header = encode_header(kind, len(payload))
    with _SEND_LOCK:
        held = _hold_interrupts() if defer_sigint and threading.get_ident() == threading.main_thread().ident else None
        try:
            if len(payload) <= _ONE_WRITE_BELOW:  # most frames: one write, one wake-up of the reader
                _write_all(fd, header + payload)
            else:
                _write_all(fd, header)
                _write_all(fd, payload)
        finally:
            if held is not None:
                held.release()


class _HeldInterrupt:
    """SIGINT's Python handler while a frame is written: it records the signal; ``release`` puts
    the previous handler back and, if a SIGINT came, calls it (default_int_handler raises)."""

    __slots__ = ("caught", "previous")

    def __init__(self, previous: Callable[[int, Any], Any]) -> None:
        self.previous = previous
        self.caught: tuple[int, Any] | None = None

    def __call__(self, signum: int, frame: Any) -> None:
        self.caught = (signum, frame)

    def release(self) -> None:
        _signal.signal(_SIGINT, self.previous)
        if self.caught is not None:
            self.previous(*self.caught)


def _hold_interrupts() -> _HeldInterrupt | None:
    """Hold SIGINT back (main thread only); None where its handler is not Python's (ignored,
    default): then no KeyboardInterrupt can come, and the disposition stays as it is."""
    previous = _signal.getsignal(_SIGINT)
    if not callable(previous):
        return None
    held = _HeldInterrupt(previous)
    _signal.signal(_SIGINT, held)
    return held


_SIGINT = signal.SIGINT.value  # an int: _signal's functions take no enums
_ONE_WRITE_BELOW = 64 * 1024  # bytes: joining costs a copy of the payload, cheap below this


def encode_header(kind: Kind, length: int) -> bytes:
    return _HEADER.pack(VERSION, kind, length)


def _write_all(fd: int, data: bytes | bytearray) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class FrameDecoder:
    """Reassembles frames from a stream, copying each payload once at most.

    A frame's payload gets one buffer of its final size as soon as its header is read; the bytes
    of a chunk are copied into it (``feed``), or a file descriptor's are read straight into it
    (``read_from``: no copy at all), and that buffer is the event's payload. A 1 GiB result costs
    1 GiB in the kernel while it arrives, not several (a growing buffer, a slice, bytes of it).
    """

    def __init__(self, mailbox: Mailbox | None = None) -> None:
        self.mailbox = mailbox  # given to every event decoded: the memfds a payload names come from there
        self._header = bytearray()
        self._kind = 0
        self._body: bytearray | None = None  # the payload being filled, once its header was read
        self._filled = 0

    def feed(self, chunk: bytes | bytearray | memoryview) -> list[Event]:
        """Every event completed by ``chunk``; raises FrameError on a frame it cannot read."""
        view = memoryview(chunk).cast("B")
        decoded: list[Event] = []
        while view:
            if self._body is None:
                view = self._take_header(view, decoded)
            else:
                take = min(len(view), len(self._body) - self._filled)
                self._body[self._filled : self._filled + take] = view[:take]
                self._filled += take
                view = view[take:]
                self._finish_body(decoded)
        return decoded

    def read_from(self, fd: int, size: int = 1 << 20) -> tuple[list[Event], bool]:
        """Read what ``fd`` (non-blocking) holds now: the events completed, and False at end of file.

        A big payload's bytes are read into its own buffer directly."""
        try:
            if self._body is not None and len(self._body) - self._filled >= size:
                count = os.readv(fd, [memoryview(self._body)[self._filled :]])
                if not count:
                    return [], False
                self._filled += count
                decoded: list[Event] = []
                self._finish_body(decoded)
                return decoded, True
            chunk = os.read(fd, size)
        except BlockingIOError:
            return [], True
        if not chunk:
            return [], False
        return self.feed(chunk), True

    def _take_header(self, view: memoryview, decoded: list[Event]) -> memoryview:
        take = min(len(view), _HEADER.size - len(self._header))
        self._header += view[:take]
        view = view[take:]
        if len(self._header) < _HEADER.size:
            return view
        version, kind, length = _HEADER.unpack_from(self._header)
        if version != VERSION:
            raise FrameError(f"event frame of format version {version}, but this nbaccel reads version {VERSION}; run the same nbaccel on both ends.")
        self._header.clear()
        self._kind = kind
        if length <= len(view):  # the whole (small) frame is here: one slice, no buffer to grow
            decoded.append(Event(decode_kind(kind), bytes(view[:length]), self.mailbox))
            return view[length:]
        self._body, self._filled = bytearray(length), 0
        return view

    def _finish_body(self, decoded: list[Event]) -> None:
        if self._body is not None and self._filled == len(self._body):
            decoded.append(Event(decode_kind(self._kind), self._body, self.mailbox))
            self._body = None

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame received so far (header included)."""
        return len(self._header) + (_HEADER.size + self._filled if self._body is not None else 0)


def read_frame(fd: int) -> Event | None:
    """Block until one whole frame arrives on ``fd`` and return it, reading no byte past it (the
    rest of the stream is another reader's); None at end of file."""
    header = _read_exactly(fd, _HEADER.size)
    if header is None:
        return None
    version, kind, length = _HEADER.unpack(header)
    if version != VERSION:
        raise FrameError(f"event frame of format version {version}, but this nbaccel reads version {VERSION}; run the same nbaccel on both ends.")
    payload = _read_exactly(fd, length) if length else b""
    if payload is None:
        return None
    return Event(decode_kind(kind), payload)


def _read_exactly(fd: int, size: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = os.read(fd, size - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


def decode_kind(code: int) -> Kind:
    """The ``Kind`` of a frame's kind byte; ``FrameError`` for one this nbaccel does not know.

    The one decoder of kinds, for frames read from a pipe and frames a node agent forwarded.

    Example:
        >>> decode_kind(1)
        <Kind.RESULT: 1>
        >>> decode_kind(99)
        Traceback (most recent call last):
        ...
        nbaccel.errors.FrameError: unknown event kind 99 in a frame; run the same nbaccel version on both ends.
    """
    try:
        return Kind(code)
    except ValueError:
        raise FrameError(f"unknown event kind {code} in a frame; run the same nbaccel version on both ends.") from None
