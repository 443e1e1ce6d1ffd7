"""What became of each rank of a launch: the value it returned, or how it failed.

Every wording of how a rank ended (a summary line, a tab title, a chip, the headline of the
error a launch raises, a worker's exit status) comes from ``status_words`` and
``failure_headline`` here, so a failure reads the same everywhere.

Example:
    >>> ok = RankOutcome(rank=0, status=Status.SUCCEEDED, exitcode=0)
    >>> ok.describe()
    'rank 0: succeeded'
    >>> failure_headline(RankOutcome(rank=1, status=Status.SIGNALED, signal=9))
    'rank 1 failed: killed by SIGKILL'
"""

from __future__ import annotations

import dataclasses
import enum
import re
import signal
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbaccel.wire.events import Event


class Status(str, enum.Enum):
    """How a rank ended. RUNNING only while the launch is in flight."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"  # returned a value
    FAILED = "failed"  # raised an exception (see RankOutcome.error)
    EXITED = "exited"  # left with a non-zero exit code and no exception (os._exit, sys.exit)
    SIGNALED = "killed"  # killed by a signal nbaccel did not send (segfault, OOM killer)
    STOPPED = "stopped"  # stopped by nbaccel because another rank failed
    INTERRUPTED = "interrupted"  # stopped by the kernel's interrupt
    TIMED_OUT = "timed out"  # stopped by nbaccel because the launch's timeout passed


# Errors a rank raises only because a *peer* went away: never the root cause of a failure.
_PEER_ERROR = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|"
    r"connectFullMesh failed|Connection refused|remote process exited|"
    r"DistNetworkError|DistBackendError|NCCL communicator was aborted",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class RemoteError:
    """An exception raised on a rank, carried back as text (exception objects may not pickle)."""

    type_name: str
    message: str
    traceback: str
    timestamp: float  # time.time() on the rank when it was caught

    @property
    def is_peer_error(self) -> bool:
        """True when the error only reports that another rank vanished."""
        return bool(_PEER_ERROR.search(f"{self.type_name}: {self.message}"))

    def headline(self) -> str:
        return f"{self.type_name}: {self.message}" if self.message else self.type_name

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> RemoteError:
        """The error a rank sent, its traceback naming notebook cells as IPython does."""
        error = cls(**fields)
        return dataclasses.replace(error, traceback=with_cell_names(error.traceback))


@dataclass
class RankOutcome:
    """The end of one rank: status, exit code or signal, error, and its last lines of output."""

    rank: int
    status: Status = Status.RUNNING
    exitcode: int | None = None
    signal: int | None = None
    error: RemoteError | None = None
    value: Any = None
    last_lines: list[str] = field(default_factory=list)
    where: str = ""  # where it was when nbaccel stopped it: one line (nbaccel.launch.stacks)
    stack: str = ""  # and every thread's Python stack
    peak_rss: int | None = None  # most resident bytes the kernel sampled (nbaccel.launch.sampler)
    out_of_memory: str | None = None  # "killed by the out-of-memory killer (peak ...)", when it was

    @property
    def signal_name(self) -> str | None:
        return None if self.signal is None else signal_words(self.signal)

    def describe(self) -> str:
        """One line, for summaries: 'rank 1: failed (ValueError: boom)'."""
        return f"rank {self.rank}: {status_words(self).summary}"

    def headline(self, node: str = "") -> str:
        """Why it failed, in one line (``failure_headline``): what ``RankFailedError`` says first."""
        return failure_headline(self, node)

    @property
    def is_failure(self) -> bool:
        """A failure that started the launch's end (not a rank nbaccel stopped)."""
        return self.status in (Status.FAILED, Status.EXITED, Status.SIGNALED)


def record_answer(outcome: RankOutcome, event: Event, stop_reason: Status | None, last_lines: list[str]) -> None:
    """What a rank's RESULT or ERROR event says about its outcome; the one decoder of answers.

    An error that only echoes a stop already under way (our own interrupt, a peer's closed
    connection) takes the stop's status, so it is never mistaken for the root cause.
    """
    from nbaccel.wire.events import Kind

    outcome.last_lines = list(last_lines)
    if event.kind is Kind.RESULT:
        try:
            outcome.value = event.value()
        except Exception as exc:  # noqa: BLE001 - any unpickling failure is that rank's
            outcome.error = undecodable_result(outcome.rank, exc)
            outcome.status = Status.FAILED
            return
        outcome.status = Status.SUCCEEDED
        return
    outcome.error = RemoteError.from_fields(event.value())
    echoes_stop = stop_reason is not None and (outcome.error.is_peer_error or outcome.error.type_name == "KeyboardInterrupt")
    outcome.status = stop_reason if echoes_stop and stop_reason is not None else Status.FAILED


def record_exit(outcome: RankOutcome, returncode: int, stop_reason: Status | None, signalled: bool, last_lines: list[str]) -> None:
    """How a reaped rank ended, from its exit status and what it reported; the one decoder of exits."""
    outcome.last_lines = list(last_lines)
    outcome.exitcode = returncode if returncode >= 0 else None
    outcome.signal = -returncode if returncode < 0 else None
    if outcome.status is Status.SUCCEEDED and returncode != 0 and not signalled:
        outcome.status = Status.EXITED  # returned, then died in teardown: the value is suspect
    elif outcome.status is Status.RUNNING:
        if stop_reason is not None and (signalled or outcome.error is not None):
            outcome.status = stop_reason  # our stop ended it (its error, if any, only echoed the stop)
        else:
            outcome.status = crash_status(returncode)


def crash_status(returncode: int) -> Status:
    """The status of a process that ended on its own, without an answer."""
    return Status.SIGNALED if returncode < 0 else Status.EXITED


def where_ranks_were(outcomes: list[RankOutcome]) -> str:
    """'where each rank was:' and one line per rank that reported its stack; "" when none did."""
    lines = [f"  {o.where}" for o in outcomes if o.where]
    return "where each rank was:\n" + "\n".join(lines) if lines else ""


def last_line(lines: list[str]) -> str:
    """The latest line of output, or "" when there is none (what timeouts and stalls report)."""
    return lines[-1] if lines else ""


@dataclass(frozen=True)
class StatusWords:
    """How a rank's state is said, in each register nbaccel uses (never colour alone).

    ``kind`` groups states (running, done, failed, stopped: the output layer colours by it);
    ``short`` fits a tab title, ``long`` a status chip, ``summary`` one line among every rank's.
    """

    kind: str
    short: str
    long: str
    summary: str


def status_words(outcome: RankOutcome) -> StatusWords:
    """The words for ``outcome``'s state (the one place that words it).

    Example:
        >>> words = status_words(RankOutcome(rank=1, status=Status.EXITED, exitcode=3))
        >>> words.short, words.long
        ('failed (exit 3)', 'failed: exited with code 3 without returning')
    """
    status = outcome.status
    if status is Status.RUNNING:
        return StatusWords("running", "running", "running", "running")
    if status is Status.SUCCEEDED:
        return StatusWords("done", "done", "done", "succeeded")
    if status is Status.FAILED:
        return _raised_words(outcome)
    if status in (Status.EXITED, Status.SIGNALED):
        return _died_words(outcome)
    if status is Status.STOPPED:
        how = f" ({outcome.signal_name})" if outcome.signal_name else ""
        return StatusWords("stopped", "stopped", f"stopped by nbaccel after another rank failed{how}", "stopped")
    if status is Status.INTERRUPTED:
        return StatusWords("stopped", "interrupted", "interrupted (kernel interrupt)", "interrupted")
    if status is Status.TIMED_OUT:
        return StatusWords("stopped", "timed out", "stopped: the launch's timeout passed", "timed out")
    return StatusWords("stopped", status.value, status.value, status.value)


def _raised_words(outcome: RankOutcome) -> StatusWords:
    error = outcome.error
    name = error.type_name if error is not None else "error"
    code = f", exit code {outcome.exitcode}" if outcome.exitcode is not None else ""
    summary = f"failed ({_shorten(error.headline())})" if error is not None else "failed"
    return StatusWords("failed", f"failed ({name})", f"failed: {name}{code}", summary)


def _died_words(outcome: RankOutcome) -> StatusWords:
    """A rank that ended without raising: killed by a signal, or a bare exit."""
    if outcome.signal is not None and outcome.out_of_memory:
        return StatusWords("failed", "failed (out of memory)", f"failed: {outcome.out_of_memory}", outcome.out_of_memory)
    if outcome.signal is not None:
        killed = f"killed by {signal_words(outcome.signal)}"
        if outcome.status is Status.EXITED:  # it returned its value, then died
            killed += " after returning"
        return StatusWords("failed", f"failed ({signal_words(outcome.signal)})", f"failed: {killed}", killed)
    exited = f"exited with code {outcome.exitcode} without returning"
    return StatusWords("failed", f"failed (exit {outcome.exitcode})", f"failed: {exited}", exited)


def failure_headline(outcome: RankOutcome, node: str = "") -> str:
    """One line that says why a failed rank failed: 'rank 1 failed: ValueError: boom'.

    It heads ``RankFailedError``, a failed rank's panel and the widget view's banner. ``node``
    (a cluster's words for where the rank ran) follows the rank: 'rank 3 on node 1 (...) failed'.

    Example:
        >>> failure_headline(RankOutcome(rank=3, status=Status.SIGNALED, signal=9), "node 1")
        'rank 3 on node 1 failed: killed by SIGKILL'
    """
    who = f"rank {outcome.rank} on {node}" if node else f"rank {outcome.rank}"
    if outcome.status is Status.FAILED and outcome.error is not None:
        return f"{who} failed: {outcome.error.headline()}"
    return f"{who} {status_words(outcome).long}"


def signal_words(signum: int) -> str:
    """A signal's name, 'SIGKILL' ('signal 99' for a number without one)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def exit_words(returncode: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it).

    Example:
        >>> exit_words(-9), exit_words(3)
        ('killed by SIGKILL', 'exited with code 3')
    """
    return f"killed by {signal_words(-returncode)}" if returncode < 0 else f"exited with code {returncode}"


def with_cell_names(text: str) -> str:
    """Name notebook cells as IPython does (``Cell In[3], line 2``), not by their temp file."""
    try:
        from IPython import get_ipython
    except ImportError:
        return text
    shell = get_ipython()
    names = getattr(getattr(shell, "compile", None), "_filename_map", None)
    if not names:
        return text

    def rename(match: re.Match[str]) -> str:
        number = names.get(match.group(1))
        return f"Cell In[{number}], line {match.group(2)}" if number is not None else match.group(0)

    return _FILE_LINE.sub(rename, text)


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')


def undecodable_result(rank: int, exc: Exception) -> RemoteError:
    """The error for a value that arrived but cannot be unpickled in the kernel."""
    import time

    return RemoteError(
        "UnpicklableResultError",
        f"rank {rank}'s return value reached the kernel but cannot be unpickled there: {exc}. "
        "Its class may exist only on the rank (defined after the fork, or in a module the kernel "
        "cannot import); return plain data, or import that module in the notebook first.",
        "",
        time.time(),
    )


def _shorten(text: str, limit: int = 100) -> str:
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= limit else first[: limit - 3] + "..."


def root_cause(outcomes: list[RankOutcome]) -> RankOutcome | None:
    """The rank whose failure caused the others: the earliest real error, never a peer's.

    Ranks that raised a genuine exception come first (earliest timestamp wins); then ranks that
    died without one (signal, bare exit); peers that only saw a closed connection come last.
    """
    failures = [o for o in outcomes if o.is_failure]
    if not failures:
        return None

    def rank_order(outcome: RankOutcome) -> tuple[int, float, int]:
        error = outcome.error
        if error is not None and not error.is_peer_error:
            return (0, error.timestamp, outcome.rank)
        if error is None:
            return (1, 0.0, outcome.rank)
        return (2, error.timestamp, outcome.rank)

    return min(failures, key=rank_order)
