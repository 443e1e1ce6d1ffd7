"""Big tensors and arrays through shared memory: results, push, pull and launch arguments; nothing left.

Imports internals (launch, wire): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import signal
import socket

import numpy as np
import pytest
import torch

import nbaccel
from nbaccel.launch import fork_server
from nbaccel.wire import events, shm

pytestmark = pytest.mark.timeout(180)

MIB = 1 << 20


def memfds_open() -> list[str]:
    return [fd for fd in os.listdir("/proc/self/fd") if "memfd:" in _target(fd)]


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


@pytest.fixture
def no_pickled_bytes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The sizes of every RESULT frame a rank sends (a memfd'd 4 MiB result is a small frame)."""
    sizes: list[int] = []
    real = events.send_bytes

    def recording(fd: int, kind: events.Kind, payload: bytes, defer_sigint: bool = True) -> None:
        if kind is events.Kind.RESULT:
            sizes.append(len(payload))
        real(fd, kind, payload, defer_sigint)

    monkeypatch.setattr(events, "send_bytes", recording)
    return sizes


def test_a_big_result_arrives_through_a_memfd_not_the_pipe(no_pickled_bytes) -> None:
    results = nbaccel.notebook_launcher(lambda: (torch.full((MIB,), float(os.environ["RANK"])), np.ones(MIB // 8 + 1), "small"), num_processes=2)
    assert [r[0].sum().item() for r in results] == [0.0, float(MIB)]
    assert all(r[1].sum() == MIB // 8 + 1 and r[2] == "small" for r in results)
    results[0][0][0] = 7.0  # the kernel's private mapping is writable
    assert memfds_open() == []


def test_a_small_result_stays_in_band() -> None:
    attached = shm.Attachments()
    events.dumps(torch.ones(1000), attached)
    assert attached.fds == []


def test_push_and_pull_move_big_values_by_memfd_to_every_worker() -> None:
    pool = nbaccel.start_workers(2)
    try:
        big = torch.arange(MIB, dtype=torch.float64)
        pool.push(w=big, a=np.arange(MIB // 4, dtype=np.float32))
        assert (
            pool.run_task(lambda ns: (ns["w"].sum().item(), float(ns["a"].sum())))
            == [(big.sum().item(), float(np.arange(MIB // 4, dtype=np.float32).sum()))] * 2
        )
        pulled = pool.pull("w", rank=1)
        assert torch.equal(pulled, big)
        assert memfds_open() == []
    finally:
        pool.stop()


@pytest.mark.slow  # a fork server exec'd fresh (it imports torch) and spawned ranks: seconds
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_launch_arguments_travel_by_memfd_on_the_non_fork_paths(start_method: str) -> None:
    big = torch.arange(2 * MIB, dtype=torch.float32)
    try:
        results = nbaccel.notebook_launcher(lambda t: (t.sum().item(), t.is_shared()), args=(big,), num_processes=2, start_method=start_method)
    finally:
        fork_server.shutdown()
    assert results == [(big.sum().item(), True)] * 2
    assert memfds_open() == []


def test_a_rank_killed_after_posting_leaves_nothing() -> None:
    def post_and_die() -> None:
        mailbox = shm.rank_mailbox()
        attached = shm.Attachments()
        events.dumps(torch.ones(MIB), attached)
        mailbox.post(attached)  # the memfd is in flight; no frame names it
        os.kill(os.getpid(), signal.SIGKILL)

    # Two ranks, one thread each: a forked rank's first multi-threaded op can hang in libgomp once
    # this process ran one (issue 14, item 16), and copying 4 MiB is such an op.
    with pytest.raises(nbaccel.RankFailedError, match="SIGKILL|signal 9|killed"):
        nbaccel.notebook_launcher(post_and_die, num_processes=2)
    assert memfds_open() == []


def test_every_dtype_and_layout_arrives_equal_through_a_memfd() -> None:
    """The bytes are written into the memfd as they lie in memory: strided, bf16, bool, complex
    tensors, Parameters and non-contiguous arrays arrive equal, contiguous, with their flags."""
    base = torch.arange(2 * MIB, dtype=torch.float32).reshape(1024, 2048)
    values = {
        "strided": base.t()[::2],
        "bf16": torch.randn(MIB, dtype=torch.bfloat16),
        "bool": torch.rand(4 * MIB) > 0.5,
        "complex": torch.randn(MIB // 2, dtype=torch.complex64),
        "parameter": torch.nn.Parameter(torch.randn(MIB)),
        "array": np.arange(4 * MIB, dtype=np.int16).reshape(2048, 2048)[:, ::2],
    }
    attached = shm.Attachments()
    try:
        payload = shm.dumps(values, attached)
        assert len(payload) < 4096 and len(attached.fds) == len(values)  # every one by memfd
        kernel_end, rank_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with kernel_end, rank_end:
            sender, receiver = shm.Mailbox(kernel_end), shm.Mailbox(rank_end)
            sender.post(attached, close=False)
            back = shm.loads(payload, receiver)
            receiver.close()
    finally:
        attached.close()
    for name, value in values.items():
        if isinstance(value, np.ndarray):
            assert np.array_equal(back[name], value), name
            continue
        assert back[name].dtype == value.dtype and torch.equal(back[name], value.detach()), name
    assert isinstance(back["parameter"], torch.nn.Parameter) and back["parameter"].requires_grad
