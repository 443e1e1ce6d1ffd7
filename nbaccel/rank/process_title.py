"""What nbaccel's processes are called in ``ps``, ``top``, ``htop`` and ``nvidia-smi``.

A forked rank, the fork server and a node agent are Python processes; a forked one keeps the
kernel's command line (``python -m ipykernel_launcher -f ...``), so five identical lines would
show where one kernel and four ranks run. Each says what it is instead, twice:

- its *comm* (``/proc/<pid>/comm``: ``top``, ``ps -e``, ``ps -o comm``, htop's command name), up
  to 15 bytes, set by ``prctl(PR_SET_NAME)``: ``nbaccel-r1/4``, ``nbaccel-w1/4``,
  ``nbaccel-forksrv``, ``nbaccel-agent2``. Threads started later inherit it;
- its *command line* (``/proc/<pid>/cmdline``: ``ps aux``, ``ps -ef``, htop, ``nvidia-smi``'s
  process name): ``nbaccel rank 1/4 (cell [12])``, ``nbaccel worker 1/4``, ``nbaccel fork server
  (kernel 1234)``, ``nbaccel agent node 2 (cluster 10.0.0.1:29400)``. Written in place over the
  argument strings the Linux kernel gave the process at exec (``arg_start`` to ``arg_end`` of
  ``/proc/self/stat``), as ``setproctitle`` does, but without moving the environment behind it:
  a longer title is cut to that length (a kernel's ``-f .../kernel-<uuid>.json`` leaves ~100
  bytes). The environment's strings stay where C's ``getenv`` (NCCL, CUDA) reads them.

The argument area is found once, at import, in the kernel: a fork keeps its address. Naming a
rank then costs one ``prctl`` and one write of ~100 bytes, with its words made (the label once
per launch, in the kernel: ``Job.label``): about 0.1 ms of a forked rank's start measured on 2
busy cores (load 10 to 16), most of it the pages it must copy, against ~17 ms for the whole
start (``benchmarks/process_title_bench.py``). Off Linux, nothing is renamed.

Example:
    >>> rank_title(1, 4, "cell [12]"), rank_comm(1, 4)
    ('nbaccel rank 1/4 (cell [12])', 'nbaccel-r1/4')
"""

from __future__ import annotations

import ctypes
import sys

from nbaccel.rank.capture import _libc

_PR_SET_NAME = 15
COMM_BYTES = 15  # the Linux kernel keeps 16 bytes of a task's name, its NUL included


def _argument_area() -> tuple[int, int] | None:
    """``(arg_start, arg_end)`` of this process (fields 48 and 49 of ``/proc/self/stat``, Linux 3.5+)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        with open("/proc/self/stat", "rb") as stat:
            text = stat.read()
        fields = text[text.rfind(b")") + 2 :].split()  # the comm may hold spaces and ")": fields start after the last
        start, end = int(fields[45]), int(fields[46])
    except (OSError, ValueError, IndexError):
        return None
    return (start, end) if 0 < start < end else None


def _area_view(area: tuple[int, int] | None) -> memoryview | None:
    """The argument area as writable bytes (it lies on the process's stack: readable, writable)."""
    if area is None:
        return None
    return memoryview((ctypes.c_char * (area[1] - area[0])).from_address(area[0])).cast("B")


# Made in the kernel, once: a rank inherits them. A fork writes each object it touches into a
# copy of its page (~5 us a page), so a rank reuses the prctl the bootstrap has just called
# (PR_SET_PDEATHSIG) and writes the area through one view: no lookup, no ctypes call for it.
_AREA = _argument_area()
_VIEW = _area_view(_AREA)
_PRCTL = getattr(_libc, "prctl", None) if _libc is not None and sys.platform.startswith("linux") else None


def set_title(title: str, comm: str) -> None:
    """Call this process ``title`` (its command line) and ``comm`` (its 15-byte name).

    Only the calling thread's name changes with ``comm``: call it from the main thread (a
    rank's, the server's, the agent's), before other threads start, so theirs follow.

    Example::

        set_title("nbaccel agent node 2", "nbaccel-agent2")
    """
    set_encoded(encode_title(title, comm))


def encode_title(title: str, comm: str) -> tuple[bytes, bytes]:
    """``title`` and ``comm`` as ``set_encoded`` writes them: made by a fork starter in the
    parent, so that a forked rank writes them without making them (pages it would copy).

    The NULs after the title end it, and the last byte stays NUL: the Linux kernel then reads
    the command line from the argument area alone, and tools show the title as one argument.

    Example:
        >>> encode_title("nbaccel rank 0/2", "nbaccel-r0/2")[1]
        b'nbaccel-r0/2'
    """
    size = len(_VIEW) if _VIEW is not None else 0
    return (title.encode()[: size - 1].ljust(size, b"\0") if size else b""), comm.encode()[:COMM_BYTES]


def set_encoded(encoded: tuple[bytes, bytes]) -> None:
    """Call this process what ``encode_title`` made (here, or in the process this one was forked from)."""
    title, comm = encoded
    if _PRCTL is not None:
        _PRCTL(_PR_SET_NAME, comm)
    if _VIEW is not None and len(title) == len(_VIEW):
        _VIEW[:] = title


def command_line(pid: int | str = "self") -> str:
    """What ``ps aux`` shows for ``pid``: its command line, the arguments joined by spaces.

    Example:
        >>> command_line() != ""
        True
    """
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        return cmdline.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")


def rank_title(rank: int, world_size: int, label: str | None) -> str:
    """``nbaccel rank 1/4 (cell [12])``: a one-shot rank, with what it runs when known."""
    return f"nbaccel rank {rank}/{world_size} ({label})" if label else f"nbaccel rank {rank}/{world_size}"


def rank_comm(rank: int, world_size: int) -> str:
    return f"nbaccel-r{rank}/{world_size}"


def name_rank(rank: int, world_size: str | int, label: str | None) -> None:
    """Name this process as ``rank`` of ``world_size`` running ``label`` (a cell, a function's name)."""
    set_title(rank_title(rank, int(world_size), label), rank_comm(rank, int(world_size)))


def name_worker(rank: int, world_size: str | int) -> None:
    """``nbaccel worker 1/4``: a persistent worker (``WorkerPool``), whatever cell it runs."""
    set_title(f"nbaccel worker {rank}/{world_size}", f"nbaccel-w{rank}/{world_size}")


def name_fork_server(kernel_pid: int) -> None:
    """``nbaccel fork server (kernel 1234)``: the kernel's fork server (``nbaccel.launch.starters.fork_server``)."""
    set_title(f"nbaccel fork server (kernel {kernel_pid})", "nbaccel-forksrv")


def name_agent(node: str | None, address: str) -> None:
    """``nbaccel agent node 2 (cluster HOST:PORT)``; ``node`` None while it joins."""
    if node is None:
        set_title(f"nbaccel agent (joining {address})", "nbaccel-agent")
    else:
        set_title(f"nbaccel agent node {node} (cluster {address})", f"nbaccel-agent{node}")
