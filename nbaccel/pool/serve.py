"""Rank side of a persistent worker: join the process group once, then run tasks until told to stop.

Each task is a cloudpickled callable taking the rank's namespace (a dict that lives as long as
the worker, so a variable a cell defines is there for the next cell). An interrupt stops the task
that runs, not the worker; an interrupt while idle changes nothing.

Example (what the pool starts on every rank)::

    Job(serve, args=(seed_namespace,), pass_ends=True)
"""

from __future__ import annotations

import builtins
import os
import signal
import sys
from typing import Any

from nbaccel.devices import nvml
from nbaccel.errors import EngineStateError
from nbaccel.rank import process_title
from nbaccel.rank.bootstrap import call_and_report
from nbaccel.wire import events, shm
from nbaccel.wire.job import ChildEnds

_DEFERRED_NOTE = "nbaccel: destroy_process_group() is deferred until the workers stop, so the next cell still has its process group (said once)"


def serve(ends: ChildEnds, seed: dict[str, Any] | None) -> None:
    """The persistent worker's main loop; returns when the kernel says STOP or goes away."""
    if ends.commands is None:
        raise EngineStateError("a persistent worker was started without a command stream")
    process_title.name_worker(int(os.environ.get("RANK", "0")), os.environ.get("WORLD_SIZE", "1"))
    namespace = _namespace(seed)
    state = _join_process_group()
    restore = _defer_destroy_process_group()
    interrupts = TaskInterrupts()
    signal.signal(signal.SIGINT, interrupts.handle)
    events.send(ends.channel, events.Kind.READY, {"pid": os.getpid(), "device": nvml.physical_name(str(state.device))})
    decoder = events.FrameDecoder(shm.rank_mailbox())  # a pushed tensor's memory comes beside the command
    try:
        while True:
            command = _next_command(ends.commands, decoder)
            if command is None or command.kind is events.Kind.STOP:
                break
            task = command.value()
            call_and_report(lambda: interrupts.run(task, namespace), ends.channel)  # noqa: B023 - called at once, in this iteration
    finally:
        restore()
    # Every rank joined the group before READY, so leaving needs no exit barrier here.
    _destroy_default_group()


class TaskInterrupts:
    """SIGINT raises KeyboardInterrupt only while a task runs.

    The kernel interrupts the ranks it believes busy; one that has just answered gets the
    signal between tasks (while sending its answer, or after reading the next command), where
    a KeyboardInterrupt would kill the worker or lose a command. There it is dropped.
    """

    def __init__(self) -> None:
        self.busy = False

    def handle(self, signum: int, frame: Any) -> None:
        if self.busy:
            raise KeyboardInterrupt

    def run(self, task: Any, namespace: dict[str, Any]) -> Any:
        self.busy = True
        try:
            return task(namespace)
        finally:
            self.busy = False


def _namespace(seed: dict[str, Any] | None) -> dict[str, Any]:
    from nbaccel.state.lazy import LazyPartialState

    namespace = dict(seed) if seed else {"__name__": "__main__", "__builtins__": builtins}
    namespace["state"] = LazyPartialState()  # a real PartialState, set up on first use
    return namespace


def _join_process_group() -> Any:
    from nbaccel.state import PartialState

    return PartialState()


def _next_command(fd: int, decoder: events.FrameDecoder) -> events.Event | None:
    """Block until one whole command frame arrives; None when the kernel closed the pipe."""
    pending: list[events.Event] = []
    while not pending:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return None
        pending = decoder.feed(chunk)
    if len(pending) != 1:
        raise EngineStateError(f"a worker received {len(pending)} commands at once; the kernel sends one at a time")
    return pending[0]


def _destroy_default_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _defer_destroy_process_group() -> Any:
    """Make ``dist.destroy_process_group()`` of the default group a no-op until the pool stops.

    DDP scripts end with it; on persistent workers it would break every later cell.
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.destroy_process_group
    said = False

    def destroy_process_group(group: Any = None) -> None:
        nonlocal said
        if group is not None and group is not c10d.GroupMember.WORLD:
            original(group)
            return
        if not said:
            print(_DEFERRED_NOTE, file=sys.stderr)
            said = True

    dist.destroy_process_group = c10d.destroy_process_group = destroy_process_group

    def restore() -> None:
        dist.destroy_process_group = c10d.destroy_process_group = original

    return restore
