"""How a rank's state is said in words (and coloured, for those who can see colour).

The same words label the chips, the tab titles, the static view and the text summary, so a
failure reads the same everywhere and never depends on colour alone.

Example:
    >>> from nbaccel.launch.outcome import RankOutcome, Status
    >>> rank_state(RankOutcome(rank=1, status=Status.SIGNALED, signal=9)).short
    'failed (SIGKILL)'
"""

from __future__ import annotations

from dataclasses import dataclass

from nbaccel.launch.outcome import RankOutcome, Status

# (background, text, border): muted enough to read the words on, distinct enough to scan.
_PALETTE = {
    "waiting": ("#f1f3f4", "#3c4043", "#dadce0"),
    "running": ("#e8f0fe", "#174ea6", "#aecbfa"),
    "done": ("#e6f4ea", "#0d652d", "#a8dab5"),
    "failed": ("#fce8e6", "#a50e0e", "#f6aea9"),
    "stopped": ("#fef7e0", "#7a4f01", "#fdd663"),
}
_SYMBOL = {"waiting": "○", "running": "●", "done": "✓", "failed": "✗", "stopped": "■"}


@dataclass(frozen=True)
class RankState:
    """A rank's state: its kind (for colour), a short label (tab titles) and a long one (chips)."""

    kind: str  # waiting | running | done | failed | stopped
    short: str
    long: str

    @property
    def symbol(self) -> str:
        return _SYMBOL[self.kind]

    @property
    def colours(self) -> tuple[str, str, str]:
        return _PALETTE[self.kind]

    @property
    def is_failure(self) -> bool:
        return self.kind == "failed"


WAITING = RankState("waiting", "waiting", "waiting to start")
RUNNING = RankState("running", "running", "running")


def rank_state(outcome: RankOutcome) -> RankState:
    """The words for a rank that has ended (or RUNNING while its outcome is still open)."""
    status = outcome.status
    if status is Status.RUNNING:
        return RUNNING
    if status is Status.SUCCEEDED:
        return RankState("done", "done", "done")
    if status is Status.FAILED:
        error = outcome.error
        name = error.type_name if error is not None else "error"
        code = f", exit code {outcome.exitcode}" if outcome.exitcode is not None else ""
        return RankState("failed", f"failed ({name})", f"failed: {name}{code}")
    if status is Status.EXITED:
        if outcome.exitcode is None and outcome.signal_name:  # returned, then died by a signal
            return RankState("failed", f"failed ({outcome.signal_name})", f"failed: killed by {outcome.signal_name} after returning")
        return RankState("failed", f"failed (exit {outcome.exitcode})", f"failed: exited with code {outcome.exitcode} without returning")
    if status is Status.SIGNALED:
        return RankState("failed", f"failed ({outcome.signal_name})", f"failed: killed by {outcome.signal_name}")
    if status is Status.STOPPED:
        how = f" ({outcome.signal_name})" if outcome.signal_name else ""
        return RankState("stopped", "stopped", f"stopped by nbaccel after another rank failed{how}")
    if status is Status.INTERRUPTED:
        return RankState("stopped", "interrupted", "interrupted (kernel interrupt)")
    if status is Status.TIMED_OUT:
        return RankState("stopped", "timed out", "stopped: the launch's timeout passed")
    return RankState("stopped", status.value, status.value)


def failure_headline(outcome: RankOutcome) -> str:
    """One line that says why a failed rank failed: 'rank 1 failed: ValueError: boom'."""
    if outcome.status is Status.FAILED and outcome.error is not None:
        return f"rank {outcome.rank} failed: {outcome.error.headline()}"
    return f"rank {outcome.rank} {rank_state(outcome).long}"


def elapsed_words(seconds: float) -> str:
    """'0.4 s', '12 s', '3 min 05 s', '1 h 02 min'."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
