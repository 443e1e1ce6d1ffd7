"""What tests of nbaccel (and of code built on it) stand on, instead of internal module paths.

Example:
    >>> sink = CollectingSink()
    >>> sink.output(0, "stdout", ["hello"])
    >>> sink.text(0)
    ['hello']
    >>> nbaccel_frames('File "/site/nbaccel/launch/loop.py", line 3\\nFile "Cell In[2]", line 1')
    ['File "/site/nbaccel/launch/loop.py", line 3']
    >>> scaled(2.0) >= 2.0
    True
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator

from nbaccel.devices import sysfs
from nbaccel.launch import preflight
from nbaccel.output.sinks import CollectingSink
from nbaccel.state import reset_all_states

__all__ = [
    "DEVICE_ROOT_VARIABLE",
    "TIME_SCALE_VARIABLE",
    "CollectingSink",
    "device_root",
    "mark_fork_safe",
    "mark_not_fork_safe",
    "nbaccel_frames",
    "reset_all_states",
    "scaled",
    "time_scale",
]

TIME_SCALE_VARIABLE = "NBACCEL_TEST_TIME_SCALE"
_CI_SCALE = 2.0  # a shared CI runner is slower than a developer's machine, and less predictable
_MOST_LOAD_SCALE = 4.0

# A frame of nbaccel's own in a traceback names a file inside the package, whatever it is called.
_PACKAGE_FILE = re.compile(r"nbaccel[/\\](?:[\w.-]+[/\\])*[\w.-]+\.py")


def mark_not_fork_safe(reason: str = "this kernel was marked not fork-safe by nbaccel.testing") -> None:
    """Make this process count as unsafe to fork (as if CUDA were initialised), without a GPU.

    Launches then take the path a kernel that touched CUDA takes (the fork server, or spawn).

    Example:
        >>> mark_not_fork_safe("CUDA is initialised (pretend)")
        >>> from nbaccel.launch.preflight import fork_hazards
        >>> fork_hazards()
        ['CUDA is initialised (pretend)']
        >>> mark_fork_safe()
        >>> fork_hazards()
        []
    """
    preflight.marked_unsafe[:] = [reason]


def mark_fork_safe() -> None:
    """Undo `mark_not_fork_safe` (real hazards, such as CUDA, still count)."""
    preflight.marked_unsafe.clear()


DEVICE_ROOT_VARIABLE = sysfs.ROOT_VARIABLE


@contextlib.contextmanager
def device_root(folder: str | os.PathLike[str]) -> Iterator[None]:
    """Read AMD's and Intel's device files under ``folder`` instead of ``/`` while inside.

    The test seam for GPUs of those vendors: a stand-in tree with ``sys/class/kfd/...`` (AMD's
    topology, each process's memory), ``sys/class/drm/renderD*/device`` (AMD's and Intel's
    render nodes) and ``dev/kfd`` / ``dev/dri/renderD*`` (held open by an initialised runtime).
    A new process reads ``NBACCEL_DEVICE_ROOT`` once, at import, instead.

    Example:
        >>> import tempfile
        >>> from nbaccel.devices import amd
        >>> with tempfile.TemporaryDirectory() as empty, device_root(empty):
        ...     amd.machine_gpus()
        []
    """
    before = sysfs.root()
    sysfs.set_root(folder)
    try:
        yield
    finally:
        sysfs.set_root(before)


def nbaccel_frames(traceback_text: str) -> list[str]:
    """The lines of ``traceback_text`` that point into nbaccel's own source files.

    Tracebacks shown to users should hold only their own code: assert that this is empty.
    """
    return [line for line in traceback_text.splitlines() if _PACKAGE_FILE.search(line)]


def time_scale() -> float:
    """How much longer than on an idle developer machine a time bound of a test should be.

    ``NBACCEL_TEST_TIME_SCALE`` when set (e.g. ``3`` on a slow runner). Otherwise 1, raised to 2
    when ``CI`` is true, and further by the load: with more runnable processes than CPUs every
    process gets its share of them only (capped at 4).
    """
    given = os.environ.get(TIME_SCALE_VARIABLE)
    if given:
        try:
            value = float(given)
        except ValueError:
            value = 0.0
        if not value > 0 or value == float("inf"):
            raise ValueError(f"{TIME_SCALE_VARIABLE}={given!r} is not a positive number: set it to e.g. 2 (twice the time), or unset it.")
        return value
    scale = _CI_SCALE if os.environ.get("CI", "").lower() in ("1", "true", "yes") else 1.0
    try:
        per_cpu = os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        per_cpu = 0.0
    return scale * min(max(1.0, per_cpu), _MOST_LOAD_SCALE)


def scaled(seconds: float) -> float:
    """``seconds`` times `time_scale`: use it for every time bound a test asserts or waits for.

    Example:
        >>> deadline = scaled(5.0)  # 5 s on an idle machine, more on a loaded one
    """
    return seconds * time_scale()
