"""NCCL's flight recorder, as nbaccel uses it: which collective a stuck NCCL rank is in, and its number.

On nccl a rank stuck in a collective is usually blocked somewhere else (``.item()``, a CUDA
sync), because NCCL collectives are asynchronous: its Python stack names the synchronisation
point, not the collective. torch's flight recorder keeps the last collectives of each group
(``TORCH_NCCL_TRACE_BUFFER_SIZE`` entries) and, when ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE`` is set,
its watchdog thread dumps them to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>`` whenever anything is
written to the named pipe ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe``; that thread runs even
while the rank's main thread is stuck. The launcher turns the recorder on for NCCL ranks
(``nbaccel.wire.rank_env``), the rank points both files into the launch's private stack folder
(``nbaccel.rank.stack_dump``), and the kernel pokes the pipe when it asks for stacks
(``nbaccel.launch.stacks``).

Gloo has no recorder; there the stack names the collective itself, and persistent workers compare
the ranks' collective counts after an interrupted cell (``nbaccel.pool.in_step``).

Example:
    >>> describe_last({"entries": [{"profiling_name": "nccl:all_reduce", "collective_seq_id": 12,
    ...     "state": "started", "record_id": 3, "process_group": ("0", "default_pg")}]})
    'last collective: nccl:all_reduce #12 (started)'
"""

from __future__ import annotations

import io
import json
import os
import pickle
from typing import Any

BUFFER_VARIABLE = "TORCH_NCCL_TRACE_BUFFER_SIZE"
BUFFER_DEFAULT = "2000"  # entries kept per group: what torch's own docs suggest
PIPE_VARIABLE = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"
DUMP_VARIABLE = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"
# torch's newer names for the same settings: one the user set wins over nbaccel's choice.
USER_NAMES = (BUFFER_VARIABLE, "TORCH_FR_BUFFER_SIZE", PIPE_VARIABLE, DUMP_VARIABLE, "TORCH_FR_DUMP_TEMP_FILE")


def recorder_paths(stack_file: str) -> dict[str, str]:
    """The pipe and dump prefixes for a launch, in the folder of its stack files.

    Example:
        >>> recorder_paths("/tmp/nbaccel-stacks-x/rank1.txt")[PIPE_VARIABLE]
        '/tmp/nbaccel-stacks-x/nccl-pipe-'
    """
    folder = os.path.dirname(stack_file)
    return {PIPE_VARIABLE: os.path.join(folder, "nccl-pipe-"), DUMP_VARIABLE: os.path.join(folder, "nccl-trace-")}


def pipe_path(folder: str, rank: int) -> str:
    """The named pipe NCCL's watchdog made for ``rank`` (``<prefix><rank>.pipe``)."""
    return os.path.join(folder, f"nccl-pipe-{rank}.pipe")


def dump_path(folder: str, rank: int) -> str:
    """Where the watchdog writes ``rank``'s dump (``<prefix><rank>``)."""
    return os.path.join(folder, f"nccl-trace-{rank}")


def request_dump(folder: str, rank: int) -> bool:
    """Ask ``rank``'s watchdog for a dump; False when it has no pipe (not nccl, or no group yet)."""
    return ask_over_pipe(pipe_path(folder, rank), b"1", stale=dump_path(folder, rank))


def ask_over_pipe(pipe: str, message: bytes, stale: str) -> bool:
    """Write ``message`` to the named pipe a rank's thread reads, after removing ``stale`` (the last
    answer: a new one replaces it, never read an old one); False when nobody reads that pipe.

    Example:
        >>> ask_over_pipe("/nonexistent/pipe", b"?", stale="/nonexistent/answer")
        False
    """
    try:
        os.unlink(stale)
    except OSError:
        pass
    try:
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # no pipe, or nobody reading it (ENXIO): nothing to ask
        return False
    try:
        os.write(fd, message)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True


def read_dump(path: str) -> dict[str, Any] | None:
    """A dump as torch writes it (a pickle of plain data, or JSON); None while it is missing or half written."""
    try:
        with open(path, "rb") as dump:
            data = dump.read()
    except OSError:
        return None
    if not data:
        return None
    try:
        loaded = _PlainUnpickler(io.BytesIO(data)).load()
    except Exception:  # noqa: BLE001 - cut short, or JSON: try that
        try:
            loaded = json.loads(data)
        except ValueError:
            return None
    return loaded if isinstance(loaded, dict) else None


def describe_last(dump: dict[str, Any]) -> str | None:
    """'last collective: nccl:all_reduce #12 (started)' for the newest entry, None when there is none."""
    entries = [e for e in dump.get("entries", []) if isinstance(e, dict) and "profiling_name" in e]
    if not entries:
        return None
    last = max(entries, key=lambda entry: entry.get("record_id", 0))
    state = f" ({last['state']})" if last.get("state") else ""
    return f"last collective: {last['profiling_name']} #{last.get('collective_seq_id', '?')}{state}"


class _PlainUnpickler(pickle.Unpickler):
    """Plain data only (dicts, lists, strings, numbers): the dump names no class, and a file that
    did would be refused rather than run."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a flight-recorder dump names no class, but this one names {module}.{name}")
