"""Kernel side of "where is each rank?": ask ranks for their stacks, and say in one line where each one is.

Used when a launch or a cell on workers is interrupted, times out, is stopped because a peer
failed, or stalls (``stall_report=``), and on demand (``pool.stacks()``, ``%distributed stacks``).
The rank side is ``nbaccel.rank.stack_dump``; the summary names the notebook's own line
(``Cell In[7], line 12``) and the call it is blocked in.

Example:
    >>> dump = '''Current thread 0x1 (most recent call first):
    ...   File "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", line 2800 in all_reduce
    ...   File "/tmp/cell.py", line 12 in distributed_cell
    ...   File "/usr/lib/python3/site-packages/nbaccel/rank/bootstrap.py", line 120 in execute
    ... '''
    >>> summarise(1, dump)
    'rank 1: in `all_reduce` at /tmp/cell.py, line 12'
"""

from __future__ import annotations

import ast
import atexit
import itertools
import linecache
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass

from nbaccel.launch.folder_watch import FolderWatch
from nbaccel.launch.outcome import with_cell_names
from nbaccel.wire import flight_recorder
from nbaccel.wire.stack_files import STACK_FILE_VARIABLE, STACK_SIGNAL, count_answer_path, count_pipe_path, last_line_path

__all__ = ["STACK_FILE_VARIABLE", "RankStack", "StackFiles", "summarise"]

_THREAD_HEADER = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):\s*$", re.MULTILINE)
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)', re.MULTILINE)
_LIBRARY = re.compile(r"([/\\](site|dist)-packages[/\\]|[/\\]lib[/\\]python\d|[/\\]nbaccel[/\\]|^<frozen )")
# Frames of nbaccel's engine in a rank: where the rank's own work starts (and, below it, the
# kernel's stack that a fork inherits). User code is above them.
_ENGINE_FRAME = re.compile(r'File "[^"]*nbaccel[/\\](rank|pool|wire)[/\\][^"]+\.py"')
# A rank at its debugger prompt (nbaccel.rank.debugger): said as such, at the user's line below them.
_DEBUGGER_FRAME = re.compile(r'File "[^"]*(nbaccel[/\\]rank[/\\]debugger\.py|nbaccel[/\\]wire[/\\]events\.py|[/\\](pdb|bdb|cmd)\.py)"')
_HELPER_FRAME = re.compile(r'File "[^"]*nbaccel[/\\]rank[/\\]collective_count\.py"')  # nbaccel's own thread
_IDLE = "idle, waiting for the next cell"
_IDLE_FRAME = re.compile(r'File "[^"]*nbaccel[/\\]rank[/\\]serve\.py", line \d+ in _next_command')
_SETTLE = 0.05  # a whole-looking dump is complete when the file stops growing for this long
_SETTLE_UNSURE = 0.3  # a dump whose end cannot be told (a frame line that was cut short, say)
_RECORDER_WAIT = 2.5  # NCCL's watchdog looks at its pipe about once a second
_COUNT_WAIT = 0.5  # a rank's answering thread needs the GIL, which a rank stuck in Python code holds


@dataclass(frozen=True)
class RankStack:
    """One rank's answer: every thread's stack as text (cells named as IPython names them), and one line."""

    rank: int
    text: str
    summary: str


def summarise(rank: int, dump: str) -> str:
    """'rank 1: in `dist.all_reduce` at /tmp/cell.py, line 12': the main thread's innermost user line.

    ``dump`` names files as the rank saw them; the kernel's line cache supplies the source line
    (a notebook cell's too), and cells are then named as IPython names them.
    """
    main = _main_thread(dump)
    if _at_debugger_prompt(main):
        return _at_prompt(rank, main)
    if _IDLE_FRAME.search(main):
        return f"rank {rank}: {_IDLE}"
    frames = list(_FRAME.finditer(without_launch_frames(main))) or list(_FRAME.finditer(main))[:1]
    for index, frame in enumerate(frames):
        path, line = frame.group("file"), int(frame.group("line"))
        if _LIBRARY.search(path):
            continue
        at = with_cell_names(f'File "{path}", line {line}').replace('File "', "").replace('", line', ", line")
        callee = frames[index - 1].group("function") if index > 0 else None
        call = _call_in(linecache.getline(path, line), callee)
        if call or callee:
            return f"rank {rank}: in `{call or callee}` at {at}"
        return f"rank {rank}: at {at} (in {frame.group('function')})"
    if frames:
        innermost = frames[0]
        if _ENGINE_FRAME.search(innermost.group(0)):  # between the user's code and its answer
            return f"rank {rank}: in nbaccel, finishing its part (reporting, or leaving its process group)"
        return f"rank {rank}: in `{innermost.group('function')}` ({innermost.group('file')}, line {innermost.group('line')})"
    return f"rank {rank}: no Python stack (it may be exiting, or not yet started)"


def _at_debugger_prompt(main: str) -> bool:
    """The rank waits for the kernel's answer to its prompt (its innermost frame reads it)."""
    innermost = _FRAME.search(main)
    return innermost is not None and innermost.group("function") in ("_read_exactly", "read_frame") and "debugger.py" in main


def _at_prompt(rank: int, main: str) -> str:
    """'rank 1: at its debugger prompt, at Cell In[4], line 3' (or in a post-mortem)."""
    below = summarise(rank, "\n".join(line for line in main.splitlines() if not _DEBUGGER_FRAME.search(line)))
    place = below.split(": ", 1)[1] if ": " in below else ""
    if "finishing its part" in place or "no Python stack" in place:  # a post-mortem: the frames are the traceback's
        return f"rank {rank}: at its debugger prompt (post-mortem)"
    return f"rank {rank}: at its debugger prompt, {place}"


def _call_in(source: str, callee: str | None) -> str | None:
    """The call on ``source``'s line that the rank is in: the one named like ``callee``, else the outermost."""
    try:
        tree = ast.parse(source.strip())
    except SyntaxError:
        return None
    calls = [_dotted(node.func) for node in ast.walk(tree) if isinstance(node, ast.Call)]
    named = [c for c in calls if c and callee and c.split(".")[-1] == callee]
    chosen = named or [c for c in calls if c]
    return chosen[0] if chosen else None


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else node.attr
    return None


def without_launch_frames(dump: str) -> str:
    """The dump less the frames from nbaccel's bootstrap down (the kernel's stack, inherited by the fork)."""
    kept, skipping = [], False
    for line in dump.splitlines():
        if _THREAD_HEADER.match(line) or not line.strip():
            skipping = False
        elif _ENGINE_FRAME.search(line):
            skipping = True
        if not skipping:
            kept.append(line)
    return "\n".join(kept)


def _main_thread(dump: str) -> str:
    """The thread running the rank's job (its stack starts in nbaccel's bootstrap), else the current one."""
    blocks = [block for block in _thread_blocks(dump) if not _HELPER_FRAME.search(block)]
    for block in blocks:
        if _ENGINE_FRAME.search(block):
            return block
    current = [b for b in blocks if b.startswith("Current thread")]
    return current[0] if current else (blocks[0] if blocks else dump)


def _thread_blocks(dump: str) -> list[str]:
    starts = [m.start() for m in _THREAD_HEADER.finditer(dump)]
    return [dump[a:b] for a, b in zip(starts, [*starts[1:], len(dump)], strict=False)]  # no header: no block (the end has no start)


class StackFiles:
    """A private folder with one dump file per rank; the rank finds its file in its environment.

    The folder is one of this process's ``_Folders``, made once and handed to group after group:
    a launch pays no ``mkdtemp`` and no removal (half a millisecond, measured by
    ``benchmarks/launch_bench.py``). What every rank leaves there (its dump, truncated before each
    request, and its last line, rewritten at its start) has fixed names by rank, so the next
    group's rank of the same number starts clean. A folder holding anything else (a process
    group's pipes and answers, NCCL's dumps) is removed instead of handed back.
    """

    def __init__(self) -> None:
        self.folder = _FOLDERS.take()  # mode 0700: only this user reads them
        self._closed = False

    def path(self, rank: int) -> str:
        return os.path.join(self.folder, f"rank{rank}.txt")

    def collect(self, pids: dict[int, int], timeout: float = 1.0) -> dict[int, RankStack]:
        """Signal each rank in ``pids`` (rank -> pid, ranks still running) and read what they dump.

        A rank that ends meanwhile (it may have been exiting already) is not waited for.
        """
        self._request(pids)
        recording = [rank for rank in pids if flight_recorder.request_dump(self.folder, rank)]  # NCCL ranks only
        counting = [rank for rank in pids if rank not in recording and _ask_count(self.path(rank))]
        texts = self._read_settled(pids, time.monotonic() + timeout)
        texts = {rank: text for rank, text in texts.items() if text or _alive(pids[rank])}
        notes = self._counts(counting, time.monotonic() + _COUNT_WAIT)
        notes.update(self._last_collectives(recording, time.monotonic() + _RECORDER_WAIT))
        return {rank: _answer(rank, text, notes.get(rank)) for rank, text in texts.items()}

    def dumps(self, pids: dict[int, int], timeout: float = 1.0) -> dict[int, str]:
        """Signal each rank in ``pids`` and return the text each dumped, as it dumped it.

        For a node agent: the kernel, which has the cells' source, makes the summaries.
        """
        self._request(pids)
        return self._read_settled(pids, time.monotonic() + timeout)

    def _request(self, pids: dict[int, int]) -> None:
        for rank, pid in pids.items():
            with open(self.path(rank), "w"):
                pass  # truncate: the rank appends its next dump from the start
            try:
                os.kill(pid, STACK_SIGNAL)  # the rank alone, never its process group
            except ProcessLookupError:
                pass

    def _counts(self, ranks: list[int], deadline: float) -> dict[int, str]:
        """'7 collectives issued' (on the default group) for each rank whose answering thread replied in time (a group)."""
        found: dict[int, str] = {}
        pending = set(ranks)
        with FolderWatch(self.folder) as watch:  # before the first look: an answer after it wakes the wait
            while pending:
                for rank in sorted(pending):
                    path = count_answer_path(self.path(rank))
                    if os.path.exists(path):  # written whole, by rename
                        pending.discard(rank)
                        answer = _read(path)
                        if answer.strip().isdigit():
                            found[rank] = f"{int(answer)} collective{'' if int(answer) == 1 else 's'} issued"
                left = deadline - time.monotonic()
                if not pending or left <= 0:
                    break
                watch.wait(left)
        return found

    def _last_collectives(self, ranks: list[int], deadline: float) -> dict[int, str]:
        """Each NCCL rank's newest flight-recorder entry, as its watchdog dumps it (within about a second)."""
        found: dict[int, str] = {}
        pending = set(ranks)
        with FolderWatch(self.folder) as watch:  # the watchdog writes and closes its dump: that wakes the wait
            while pending:
                for rank in sorted(pending):
                    dump = flight_recorder.read_dump(flight_recorder.dump_path(self.folder, rank))
                    if dump is not None:
                        pending.discard(rank)
                        line = flight_recorder.describe_last(dump)
                        if line:
                            found[rank] = line
                left = deadline - time.monotonic()
                if not pending or left <= 0:
                    break
                watch.wait(left)
        return found

    def _read_settled(self, pids: dict[int, int], deadline: float) -> dict[int, str]:
        """Each rank's dump once it looks whole and the file stopped growing (faulthandler writes
        no end marker, and a rank on a busy machine may pause in the middle of its dump)."""
        pending, done = set(pids), {}
        sizes: dict[int, tuple[int, float]] = {}
        while pending and time.monotonic() < deadline:
            now = time.monotonic()
            for rank in sorted(pending):
                if not _alive(pids[rank]):
                    pending.discard(rank)
                    continue
                size = _size(self.path(rank))
                last = sizes.get(rank)
                if not last or last[0] != size:
                    sizes[rank] = (size, now)
                elif size and now - last[1] >= _SETTLE:
                    text = _read(self.path(rank))
                    if _is_whole(text, self.path(rank)) or now - last[1] >= _SETTLE_UNSURE:
                        done[rank] = text
                        pending.discard(rank)
            time.sleep(0.01)
        done.update({rank: _read(self.path(rank)) for rank in pending})  # whatever arrived in time
        return done

    def close(self) -> None:
        """Hand the folder back (the ranks are reaped: nothing writes there any more); idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            names = os.listdir(self.folder)
        except OSError:
            return
        plain = all(re.fullmatch(r"rank\d+\.txt(\.last)?", name) for name in names)
        if plain:
            _FOLDERS.give_back(self.folder)
        else:
            shutil.rmtree(self.folder, ignore_errors=True)


class _Folders:
    """This process's private stack folders: one parent (``mkdtemp``, mode 0700) made on first use
    and removed when the process exits, and in it one folder per rank group alive at once (a pool
    beside a launch), reused by later groups. A forked child that starts groups of its own (a rank
    launching, a node agent's fork) makes its own parent: the pid is checked. No lock (a fork
    could copy it held): the list's pop and append and the counter's next are atomic."""

    def __init__(self) -> None:
        self._pid = 0
        self._parent = ""
        self._free: list[str] = []
        self._names = itertools.count(1)

    def take(self) -> str:
        if self._pid != os.getpid():
            self._start()
        try:
            return self._free.pop()
        except IndexError:
            folder = os.path.join(self._parent, f"group{next(self._names)}")
            os.mkdir(folder, 0o700)
            return folder

    def give_back(self, folder: str) -> None:
        if self._pid == os.getpid() and os.path.dirname(folder) == self._parent and os.path.isdir(folder):
            self._free.append(folder)

    def _start(self) -> None:
        parent = tempfile.mkdtemp(prefix="nbaccel-stacks-")
        atexit.register(_remove_at_exit, parent, os.getpid())
        self._parent, self._free, self._names = parent, [], itertools.count(1)
        self._pid = os.getpid()  # last: a thread that sees it sees the parent too


def _remove_at_exit(parent: str, pid: int) -> None:
    if os.getpid() == pid:  # a forked child that runs atexit handlers leaves its parent's folder alone
        shutil.rmtree(parent, ignore_errors=True)


_FOLDERS = _Folders()


def _is_whole(text: str, path: str) -> bool:
    """The dump ends as the rank said it would (its main thread's outermost frame), or was cut at
    faulthandler's depth limit."""
    return text.endswith((_read(last_line_path(path)) or "\0", "  ...\n"))


def _ask_count(stack_file: str) -> bool:
    """Ask the rank's answering thread for its collective count; False when it has none to ask."""
    path = count_pipe_path(stack_file)
    return flight_recorder.ask_over_pipe(path, b"?", stale=count_answer_path(stack_file))


def _answer(rank: int, text: str, last_collective: str | None = None) -> RankStack:
    text = "".join(block for block in _thread_blocks(text) if not _HELPER_FRAME.search(block)) or text
    summary = summarise(rank, text)
    if summary.endswith(_IDLE):  # between cells: in step, or the workers would have been stopped
        last_collective = None
    return RankStack(rank, with_cell_names(without_launch_frames(text)), with_last_collective(summary, last_collective))


def with_last_collective(summary: str, last_collective: str | None) -> str:
    """The summary, with the rank's last collective where the flight recorder said it (NCCL), or
    its count of collectives (gloo, from the rank's answering thread).

    Example:
        >>> with_last_collective("rank 1: in `loss.item` at Cell In[3], line 4", "last collective: nccl:all_reduce #12 (started)")
        'rank 1: in `loss.item` at Cell In[3], line 4; last collective: nccl:all_reduce #12 (started)'
    """
    return f"{summary}; {last_collective}" if last_collective else summary


def _alive(pid: int) -> bool:
    """True unless ``pid`` has ended. A child of this process is asked without reaping it (left for
    its owner to reap); a rank the fork server started is the server's child, not ours, so /proc says."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:
        return _runs_elsewhere(pid)


def _runs_elsewhere(pid: int) -> bool:
    """Whether ``pid``, another process's child, still runs (a zombie has ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            state = stat.read().rpartition(")")[2].split()[:1]  # the name in parentheses may hold spaces
    except OSError:  # gone, or no /proc (the fork server needs Linux anyway)
        return False
    return bool(state) and state[0] not in ("Z", "X")


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as dump:
            return dump.read()
    except OSError:
        return ""
