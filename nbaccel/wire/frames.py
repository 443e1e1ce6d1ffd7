"""Framed messages from a rank to the kernel over a pipe: results, errors and rich-output events.

A frame is a 1-byte kind, an 8-byte big-endian length and a pickled payload. Pipes are private
to one launch (created by the kernel, inherited by its own child), so nothing read here ever
came from a network.

Example:
    >>> r, w = os.pipe()
    >>> send(w, Kind.RESULT, {"loss": 0.5})
    >>> decoder = FrameDecoder()
    >>> [(kind.name, loads(payload)) for kind, payload in decoder.feed(os.read(r, 1024))]
    [('RESULT', {'loss': 0.5})]
"""

from __future__ import annotations

import contextlib
import enum
import io
import os
import pickle
import signal
import struct
import sys
import threading
from collections.abc import Iterator
from typing import Any

_HEADER = struct.Struct("!BQ")
# A rank may send from several threads (a tqdm monitor, a logging thread): frames must not interleave.
_SEND_LOCK = threading.Lock()


class Kind(enum.IntEnum):
    RESULT = 1  # the rank's return value (of the launch, or of one task on a persistent worker)
    ERROR = 2  # a RemoteError's fields: the rank raised
    EVENT = 3  # rich output (display data, progress) for the sinks
    READY = 4  # a persistent worker joined its process group and waits for tasks
    TASK = 5  # kernel to worker: run this (task_id, callable) in the worker's namespace
    STOP = 6  # kernel to worker: leave the serve loop
    IMPORTED = 7  # heavy modules the rank had to import (nbaccel.launch.warm), for the kernel to preload


def dumps(value: Any) -> bytes:
    """Pickle ``value``, falling back to cloudpickle for lambdas and notebook-defined classes.

    Tensors on a GPU are moved to the CPU on the way: unpickling a CUDA tensor in the kernel
    would initialise CUDA there, and no later launch could fork.
    """
    on_gpu = _cuda_in_use()
    try:
        if not on_gpu:
            return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return _dump_with(_cpu_pickler(pickle.Pickler), value)
    except (pickle.PicklingError, AttributeError, TypeError):
        import cloudpickle  # only when plain pickle cannot: it is slower and imports more

        if not on_gpu:
            return cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        return _dump_with(_cpu_pickler(cloudpickle.Pickler), value)


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


def _dump_with(pickler_class: type, value: Any) -> bytes:
    buffer = io.BytesIO()
    pickler_class(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def _cpu_pickler(base: type) -> type:
    import torch

    class CpuPickler(base):  # type: ignore[misc, valid-type]
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
                return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

    return CpuPickler


def loads(payload: bytes) -> Any:
    return pickle.loads(payload)


def send(fd: int, kind: Kind, value: Any) -> None:
    """Write one frame (blocking). Raises whatever pickling raises, before writing anything."""
    send_bytes(fd, kind, dumps(value))


def send_bytes(fd: int, kind: Kind, payload: bytes, defer_sigint: bool = True) -> None:
    """Write one frame. ``defer_sigint=False`` lets an interrupt stop a write that blocks (the
    kernel's side, which then treats the stream as broken)."""
    with _SEND_LOCK, (_sigint_deferred() if defer_sigint else contextlib.nullcontext()):
        _write_all(fd, _HEADER.pack(kind, len(payload)))
        _write_all(fd, payload)


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold SIGINT back while a frame is written: a KeyboardInterrupt half-way would corrupt the
    stream for every frame after it (persistent workers outlive interrupts)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


class FrameDecoder:
    """Reassembles frames from the chunks a non-blocking reader gets."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, chunk: bytes) -> list[tuple[Kind, bytes]]:
        self._buffer += chunk
        frames = []
        while len(self._buffer) >= _HEADER.size:
            kind, length = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append((Kind(kind), bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return frames

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still waiting for the rest."""
        return len(self._buffer)
