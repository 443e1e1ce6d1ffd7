"""The kinds of message between the kernel and its agents, and how a message carries JSON and bytes.

Kernel to agent: ``hello`` (first, to prove the kernel holds the secret), ``welcome`` (or
``refused``, with the reason: another nbaccel version),
``heartbeat`` (its body ``{"t0"}``: a clock probe), ``clock`` (a probe alone: the burst when a node
joins), ``launch`` (a launch spec as JSON plus the cloudpickled job), ``stop``,
``release`` (every rank returned: leave the process group), ``command`` (a frame for one rank's
command pipe: a persistent worker's task or stop), ``signal`` (send a signal to some ranks: a
pool's interrupt), ``close`` (the cluster is closing).

Agent to kernel: ``join`` (host, ranks, GPUs, pid and its nbaccel ``version``), ``heartbeat``,
``clock`` (the answer to a probe: ``t0`` and the node's ``t1``, ``t2``; ``nbaccel.net.clock``), ``started`` (pids), ``lines`` (a rank's stdout/stderr),
``frame`` (a rank's channel frame: result, error, event), ``exited`` (a rank's exit status, its
peak resident memory and, for a SIGKILL the agent did not send that was the OOM killer, the words),
``finished`` (every local rank of the launch has ended), ``failed`` (the ranks could not start).

Example:
    >>> spec, data = unpack_mixed(pack_mixed({"nproc": 2}, b"job"))
    >>> spec, data
    ({'nproc': 2}, b'job')
"""

from __future__ import annotations

import json
import struct
from typing import Any

HELLO, WELCOME, HEARTBEAT, LAUNCH, STOP, RELEASE, CLOSE = "hello", "welcome", "heartbeat", "launch", "stop", "release", "close"
REFUSED = "refused"  # kernel to agent, instead of welcome: why it may not join ({"reason"})
COMMAND, SIGNAL, STACKS = "command", "signal", "stacks"  # stacks: asked by the kernel, answered by the agent
CLOCK = "clock"  # both ways: the kernel's probe, the agent's answer (nbaccel.net.clock)
JOIN, STARTED, LINES, FRAME, EXITED, FINISHED, FAILED = "join", "started", "lines", "frame", "exited", "finished", "failed"

HEARTBEAT_EVERY = 0.5  # seconds between heartbeats, both ways
NODE_LOST_AFTER = 2.5  # the kernel declares a silent node lost after this long
KERNEL_LOST_AFTER = 10.0  # an agent stops its ranks and exits after this long without the kernel

_LENGTH = struct.Struct("!I")
_FRAME = struct.Struct("!BI")


def pack_mixed(spec: dict[str, Any], data: bytes) -> bytes:
    """JSON ``spec`` and opaque ``data`` in one payload (the whole payload is signed)."""
    encoded = json.dumps(spec).encode()
    return _LENGTH.pack(len(encoded)) + encoded + data


def unpack_mixed(payload: bytes) -> tuple[dict[str, Any], bytes]:
    (length,) = _LENGTH.unpack_from(payload)
    start = _LENGTH.size
    return json.loads(payload[start : start + length]), payload[start + length :]


def pack_frame(rank: int, kind: int, payload: bytes | bytearray) -> bytes:
    """A rank's channel frame, forwarded unchanged (the kernel decodes it after verification)."""
    return _FRAME.pack(kind, rank) + payload


def unpack_frame(raw: bytes) -> tuple[int, int, bytes]:
    """(global rank, channel kind, payload)."""
    kind, rank = _FRAME.unpack_from(raw)
    return rank, kind, raw[_FRAME.size :]
