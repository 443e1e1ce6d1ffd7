"""Big tensors and arrays across the event stream without pickling their bytes: memfds passed beside it.

A tensor or numpy array of at least ``THRESHOLD`` bytes in a result, a pushed value, a pulled one
or a launch's arguments is copied once into a memfd (anonymous memory with no name: nothing can
be left in /dev/shm, whatever dies) and pickled as a reference to it. The memfd travels with
SCM_RIGHTS over a SOCK_SEQPACKET socketpair beside the rank's pipes (a ``Mailbox``), posted
before the frame that names it; the receiver maps it privately (no copy; its writes stay its
own) and closes its fd, so the memory is freed when the last mapping goes. A rank may exit right
after posting: the fd in flight keeps the memory. Where no mailbox exists (ranks under a node
agent, over a network) values are pickled in-band as before.

Example:
    >>> import socket, torch
    >>> kernel_end, rank_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    >>> sender, receiver = Mailbox(rank_end), Mailbox(kernel_end)
    >>> attached = Attachments()
    >>> payload = dumps({"w": torch.ones(1 << 19)}, attached)  # 2 MiB: by memfd
    >>> sender.post(attached)
    >>> loads(payload, receiver)["w"].sum().item()
    524288.0
    >>> sender.close(); receiver.close()
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import select
import socket
import sys
from typing import Any

THRESHOLD = 1 << 20
_MAX_FDS = 250  # SCM_MAX_FD is 253: more big values than this in one payload travel in-band
_TAG = "nbaccel.shm"
_WAIT = 30.0  # the sender posted before the frame: its fds are there already, unless it died
_counter = itertools.count()


class Attachments:
    """The memfds one payload refers to, under one tag."""

    def __init__(self) -> None:
        self.tag = f"{os.getpid()}-{next(_counter)}"
        self.fds: list[int] = []

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()


class Mailbox:
    """One end of a rank's fd socket: posts attachments, and takes them by tag."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock  # SOCK_SEQPACKET: one post is one message, tag and fds together
        self._stash: dict[str, list[int]] = {}

    def post(self, attached: Attachments, close: bool = True) -> None:
        """Send ``attached``'s fds (closing ours unless ``close`` is False: the receiver has its own)."""
        if attached.fds:
            socket.send_fds(self.sock, [attached.tag.encode()], attached.fds)
        if close:
            attached.close()

    def take(self, tag: str) -> list[int]:
        """The fds posted under ``tag`` (receiving, and keeping, others meanwhile)."""
        while tag not in self._stash:
            if not select.select([self.sock], [], [], _WAIT)[0]:
                raise pickle.UnpicklingError(f"the shared memory of payload {tag} never arrived")
            data, fds, _, _ = socket.recv_fds(self.sock, 256, _MAX_FDS + 3)
            if not data:
                raise pickle.UnpicklingError(f"the sender of payload {tag} went away before its shared memory arrived")
            self._stash.setdefault(data.decode(), []).extend(fds)
        return self._stash.pop(tag)

    def preload(self, tag: str, fds: list[int]) -> None:
        """Fds that came another way (with a fork server's request, at a spawned rank's start)."""
        self._stash.setdefault(tag, []).extend(fds)

    def close(self) -> None:
        for fds in self._stash.values():
            for fd in fds:
                os.close(fd)
        self._stash.clear()
        self.sock.close()


_rank_mailbox: Mailbox | None = None
_expected: dict[str, list[int]] = {}


def use_rank_mailbox(fd: int | None) -> None:
    """Rank side: the fd socket to the kernel (None: there is none, values travel in-band)."""
    global _rank_mailbox
    _rank_mailbox = None if fd is None else Mailbox(socket.socket(fileno=fd))
    if _rank_mailbox is not None:
        for tag, fds in _expected.items():
            _rank_mailbox.preload(tag, fds)
        _expected.clear()


def expect(tag: str, fds: list[int]) -> None:
    """Rank side, before ``use_rank_mailbox``: memfds of the job that came with the rank's start."""
    _expected.setdefault(tag, []).extend(fds)


def rank_mailbox() -> Mailbox | None:
    return _rank_mailbox


def pickler_class(base: type, attached: Attachments | None, to_cpu: bool, probe: bool = False) -> type:
    """``base`` (pickle's or cloudpickle's Pickler) that puts big arrays into memfds (when
    ``attached``) and GPU tensors on the CPU first (when ``to_cpu``); a ``probe`` only checks
    that the rest pickles (big arrays become a marker, nothing is copied)."""
    torch = sys.modules.get("torch")
    numpy = sys.modules.get("numpy")

    class SharingPickler(base):  # type: ignore[misc]
        def persistent_id(self, obj: Any) -> Any:
            if probe:
                return _TAG if _big(torch, numpy, obj) else None
            if attached is None or len(attached.fds) >= _MAX_FDS:
                return None
            if type(obj) is Prewritten:
                return obj.hand_over(attached)
            if type(obj) is SharedRegion:
                return obj.reference(attached)
            if torch is not None and type(obj) in (torch.Tensor, torch.nn.Parameter):
                return _share_tensor(torch, obj, attached, to_cpu)
            if numpy is not None and type(obj) is numpy.ndarray:
                return _share_array(numpy, obj, attached)
            return None

        def reducer_override(self, obj: Any) -> Any:
            if to_cpu and torch is not None and isinstance(obj, torch.Tensor) and obj.device.type != "cpu":
                return obj.detach().cpu().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

    return SharingPickler


def _big(torch: Any, numpy: Any, obj: Any) -> bool:
    if torch is not None and isinstance(obj, torch.Tensor) or numpy is not None and isinstance(obj, numpy.ndarray):
        return bool(obj.nbytes >= THRESHOLD)
    return False


def check_picklable(value: Any, base: type = pickle.Pickler) -> None:
    """Raise what pickling ``value`` would raise, without copying its big arrays."""
    pickler_class(base, None, False, probe=True)(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)


def dumps(value: Any, attached: Attachments | None, to_cpu: bool = False, base: type = pickle.Pickler) -> bytes:
    buffer = io.BytesIO()
    pickler_class(base, attached, to_cpu)(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    return buffer.getvalue()


def loads(payload: bytes | bytearray, mailbox: Mailbox | None) -> Any:
    """Unpickle ``payload``, mapping the memfds it names (taken from ``mailbox``)."""
    if mailbox is None:
        return pickle.loads(payload)
    return _Unpickler(io.BytesIO(payload), mailbox).load()


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, mailbox: Mailbox) -> None:
        super().__init__(file)
        self.mailbox = mailbox
        self.fds: dict[str, list[int]] = {}

    def load(self) -> Any:
        try:
            return super().load()
        finally:
            for fds in self.fds.values():
                for fd in fds:
                    os.close(fd)

    def persistent_load(self, pid: Any) -> Any:
        marker, tag, index, kind, meta = pid
        if marker != _TAG:
            raise pickle.UnpicklingError(f"unknown persistent id {marker!r}")
        if tag not in self.fds:
            self.fds[tag] = self.mailbox.take(tag)
        fd = self.fds[tag][index]
        if kind == "region":
            return _map_region(fd, meta, shared=True)
        return _map_tensor(fd, meta) if kind == "tensor" else _map_array(fd, meta)


def _new_memfd(attached: Attachments, nbytes: int) -> tuple[int, int]:
    fd = os.memfd_create("nbaccel-shared", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    attached.fds.append(fd)
    return fd, len(attached.fds) - 1


def _write_all(fd: int, data: memoryview) -> None:
    """``data`` into the memfd from its start. write(2), not a mapping and a copy: the kernel
    fills the memfd's pages as it copies, where a mapping would fault each 4 KiB page in first
    (1 GiB: about 0.4 s against 0.7 s here, as fast as one ``torch.clone``)."""
    done, size = 0, data.nbytes
    while done < size:
        done += os.pwrite(fd, data[done : done + _WRITE_CHUNK], done)


_WRITE_CHUNK = 1 << 30  # Linux writes at most about 2 GiB per call


def _share_tensor(torch: Any, tensor: Any, attached: Attachments, to_cpu: bool) -> Any:
    if tensor.layout != torch.strided or tensor.is_quantized or tensor.nbytes < THRESHOLD:
        return None
    if tensor.device.type != "cpu":
        if not to_cpu:
            return None
        tensor = tensor.detach().cpu()
    fd, index = _new_memfd(attached, tensor.nbytes)
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)  # its bytes, in a copy only if it was strided
    _write_all(fd, memoryview(flat.numpy()))
    meta = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), tensor.requires_grad, isinstance(tensor, torch.nn.Parameter))
    return (_TAG, attached.tag, index, "tensor", meta)


class Prewritten:
    """A CPU tensor copied into a memfd now, pickled later as a reference to it (its fd handed over).

    A rank that streams a big value (``%distributed pull`` of a sharded model: one gathered
    parameter at a time) writes each piece here and lets go of it at once, so it never holds the
    whole value; pickled without a mailbox, it travels in-band as the tensor.

    Example:
        >>> import torch
        >>> Prewritten(torch.arange(3.0)).tensor().tolist()
        [0.0, 1.0, 2.0]
    """

    def __init__(self, tensor: Any) -> None:
        import torch

        tensor = tensor.detach()
        self.fd = os.memfd_create("nbaccel-shared", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, tensor.nbytes)
        if tensor.nbytes:
            _write_all(self.fd, memoryview(tensor.contiguous().reshape(-1).view(torch.uint8).numpy()))
        self.meta = (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), False, False)

    def hand_over(self, attached: Attachments) -> Any:
        """Its reference in a payload whose fds are ``attached`` (which closes the fd from now on)."""
        attached.fds.append(self.fd)
        self.fd = -1
        return (_TAG, attached.tag, len(attached.fds) - 1, "tensor", self.meta)

    def tensor(self) -> Any:
        """The tensor, mapped (no copy)."""
        if self.fd < 0:
            raise ValueError("this memfd was handed over to a payload already")
        return _map_tensor(self.fd, self.meta)

    def __reduce__(self) -> tuple[Any, ...]:  # no mailbox: in-band, as the tensor itself
        reduced: tuple[Any, ...] = self.tensor().clone().__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        return reduced

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class SharedRegion:
    """A memfd the kernel makes for ranks to write into: each rank maps it shared (its writes land
    in the kernel's memory, no copy on the way back), the kernel maps it to read.

    ``%distributed pull`` of a sharded model: every rank writes its own shards at their offsets in
    the full tensors, in parallel, and nothing travels back but the layout.

    Example:
        >>> region = SharedRegion(8)
        >>> region.tensor().tolist()
        [0, 0, 0, 0, 0, 0, 0, 0]
        >>> region.close()
    """

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.fd = os.memfd_create("nbaccel-region", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, max(nbytes, 1))

    def reference(self, attached: Attachments) -> Any:
        """Its reference in a payload: the rank that unpickles it maps the region shared (a uint8 tensor)."""
        attached.fds.append(os.dup(self.fd))
        return (_TAG, attached.tag, len(attached.fds) - 1, "region", self.nbytes)

    def tensor(self) -> Any:
        """The region as a uint8 tensor of ``nbytes``, mapped here (what the ranks wrote)."""
        return _map_region(self.fd, self.nbytes, shared=False)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        self.close()


def _map_region(fd: int, nbytes: int, shared: bool) -> Any:
    import torch

    storage: Any = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=shared, nbytes=max(nbytes, 1))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))


def _map_tensor(fd: int, meta: Any) -> Any:
    import torch

    dtype_name, shape, requires_grad, parameter = meta
    dtype = getattr(torch, dtype_name)
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=dtype).element_size()
    storage: Any = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=False, nbytes=nbytes)
    tensor = torch.empty(0, dtype=dtype).set_(storage, 0, shape, _contiguous_strides(shape))
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor.requires_grad_(requires_grad) if requires_grad else tensor


def _contiguous_strides(shape: Any) -> list[int]:
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


def _share_array(numpy: Any, array: Any, attached: Attachments) -> Any:
    if array.dtype.hasobject or array.nbytes < THRESHOLD:
        return None
    fd, index = _new_memfd(attached, array.nbytes)
    _write_all(fd, memoryview(numpy.ascontiguousarray(array).reshape(-1).view(numpy.uint8)))
    return (_TAG, attached.tag, index, "ndarray", (array.dtype.str, tuple(array.shape)))


def _map_array(fd: int, meta: Any) -> Any:
    """Mapped through torch's storage: Python's ``mmap`` would keep a duplicate fd for the array's life."""
    import numpy
    import torch

    dtype, shape = meta
    nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * numpy.dtype(dtype).itemsize
    storage: Any = torch.UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=False, nbytes=nbytes)
    raw = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (nbytes,), (1,))
    return raw.numpy().view(numpy.dtype(dtype)).reshape(shape)
