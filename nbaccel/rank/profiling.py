"""A rank's function under ``torch.profiler``, its trace sent to the kernel however the call ends.

``--profile`` (``notebook_launcher(profile=...)``) wraps what each rank runs in
``nbaccel.wire.rank_calls.Profiled``, which calls ``call_profiled`` on the rank. The
rank records CPU activity (and CUDA where its device is a GPU) with torch's cheap defaults: no
shapes, no stacks, no memory (each would multiply the trace's size and cost). When the call
returns, raises or is interrupted, the rank exports its Chrome trace and sends it on its event
stream as a ``profile`` event (``nbaccel.wire.rich.profile_event``): the kernel writes the files
and merges them, on one node and across nodes alike (an agent forwards the event as any other).
A rank stopped by SIGTERM after a peer's failure exports first, then dies of that signal as it
would have. Only a rank killed by SIGKILL (or stuck in C code until then) leaves no trace.

The span's ends are read on the clock torch stamps its events with (``nbaccel.net.clock.now_ns``,
the realtime clock), and the trace is read as that clock stamps it (``clock.skew_trace``: as
written, but under the test seam ``NBACCEL_TEST_CLOCK_SKEW_NS``); the kernel shifts a remote
rank's times by its node's measured offset.

Nothing here runs, and torch.profiler is never imported, without ``--profile``.

Example:
    >>> call_profiled([1, 2], function=sum)  # outside a rank nothing is sent; the value is the function's
    3
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from nbaccel.net import clock
from nbaccel.rank import heavy_imports
from nbaccel.wire import rich

# kineto prints profiler_start/profiler_stop lines on stderr for every session unless this is in
# the environment before the process's first profile (../shared/research/speed.md).
_QUIET_KINETO = {"KINETO_LOG_LEVEL": "6"}


def call_profiled(*args: Any, function: Callable[..., Any]) -> Any:
    """``function(*args)`` run under torch.profiler; the trace goes to the kernel at the end."""
    session = _Session()
    session.start()
    try:
        return function(*args)
    finally:
        session.finish()


class _Session:
    """One profiling session in this rank: started once, finished (exported and sent) once."""

    def __init__(self) -> None:
        self._profiler: Any = None
        self._started_ns = 0
        self._finished = False
        self._previous_term: Any = None

    def start(self) -> None:
        for name, value in _QUIET_KINETO.items():
            os.environ.setdefault(name, value)
        before = heavy_imports.present()
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if os.environ.get("NBACCEL_DEVICE_TYPE") == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self._profiler = profile(activities=activities)
        self._previous_term = _set_sigterm(self._on_sigterm)
        self._profiler.start()
        self._started_ns = clock.now_ns()  # after the profiler's own start-up (up to a second, once)
        heavy_imports.imported_by_nbaccel(heavy_imports.present() - before)  # the profiler imports torch._dynamo

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        ended_ns = clock.now_ns()
        try:
            self._profiler.stop()
            trace = _export(self._profiler)
        except Exception as exc:  # noqa: BLE001 - a profile must never hide the function's own outcome
            print(f"nbaccel: could not write this rank's profile ({type(exc).__name__}: {exc})", file=sys.stderr)
            return
        finally:
            _set_sigterm(self._previous_term or signal.SIG_DFL)
        _send(rich.profile_event(_rank(), socket.gethostname(), self._started_ns, ended_ns, trace))

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        """Stopped after a peer's failure: keep the trace, then die of SIGTERM as planned."""
        self.finish()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _set_sigterm(handler: Any) -> Any:
    """Install ``handler`` for SIGTERM; the previous one. Outside the main thread (where Python
    allows no handler) nothing changes: the trace is then kept on returns, errors and interrupts."""
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return None


def _export(profiler: Any) -> str:
    fd, path = tempfile.mkstemp(prefix="nbaccel-trace-", suffix=".json")
    os.close(fd)
    try:
        profiler.export_chrome_trace(path)
        with open(path, encoding="utf-8") as file:
            return clock.skew_trace(file.read())
    finally:
        os.unlink(path)


def _rank() -> int:
    return int(os.environ.get("RANK", "0"))


def _send(event: dict[str, Any]) -> None:
    from nbaccel.rank import display_hooks

    display_hooks.send_event(event)
