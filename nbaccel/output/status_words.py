"""How a rank's state is shown: the words (from ``nbaccel.launch.outcome.status_words``), a
symbol and colours, for those who can see colour.

The same words label the chips, the tab titles, the static view and the text summary, so a
failure reads the same everywhere and never depends on colour alone. The words themselves live
with the outcome (the launch layer raises errors with them and must not import this one).

Example:
    >>> from nbaccel.launch.outcome import RankOutcome, Status
    >>> rank_state(RankOutcome(rank=1, status=Status.SIGNALED, signal=9)).short
    'failed (SIGKILL)'
    >>> rank_state(RankOutcome(rank=1, status=Status.SIGNALED, signal=9)).symbol
    '✗'
"""

from __future__ import annotations

from dataclasses import dataclass

from nbaccel.launch.outcome import RankOutcome, failure_headline, status_words

__all__ = ["RUNNING", "WAITING", "RankState", "elapsed_words", "failure_headline", "rank_state"]

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
    """The state shown for a rank that has ended (or RUNNING while its outcome is still open)."""
    words = status_words(outcome)
    return RankState(words.kind, words.short, words.long)


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
