"""How many of a loud rank's lines the text view writes into the cell; the rest stay in its log file.

A notebook run headless (papermill, nbclient) saves every line written into the cell: a rank that
prints hundreds of thousands of lines makes a notebook of hundreds of megabytes that no frontend
opens. In a kernel, the text view therefore writes at most ``max_lines`` of each rank's lines per
launch (attempt) into the cell, and at most ``max_rate`` a second (a bucket of one second's
lines, refilled as time passes); the lines beyond are held back from the cell, never from the
rank's log file (``nbaccel.output.logdir``), which has every line. The first line held back gets
one notice line naming the log file; the end of the launch says how many were held back and
shows the rank's last ``tail`` lines held back. Below the cap, nothing changes.

``NBACCEL_TEXT_CAP`` sets the cap: ``LINES`` or ``LINES,RATE`` (``2000,500``; ``0`` for no limit
on either), or ``off`` for none at all.

Example:
    >>> now = [0.0]
    >>> cap = LineCap(max_lines=3, max_rate=None, tail=2, clock=lambda: now[0])
    >>> cap.admit(0, "stdout", ["a", "b"]), cap.admit(0, "stdout", ["c", "d", "e"])
    ((2, None), (1, "more than 3 lines: the rest of this launch's are held back from the cell"))
    >>> cap.held(0), cap.tail(0)
    (2, [('stdout', 'd'), ('stdout', 'e')])
"""

from __future__ import annotations

import collections
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

ENV_VAR = "NBACCEL_TEXT_CAP"
DEFAULT_LINES = 2000  # per rank and launch: a page of a real log, about 150 kB a rank in the notebook
DEFAULT_RATE = 500.0  # per rank and second: what a reader (or a browser's output area) can follow
DEFAULT_TAIL = 10  # a rank's last lines held back, shown when the launch ends


def from_env(value: str | None = None) -> tuple[int | None, float | None]:
    """``(max_lines, max_rate)`` from ``NBACCEL_TEXT_CAP`` (or ``value``); None is no limit.

    >>> from_env("100,20"), from_env("off"), from_env("0,50"), from_env("")
    ((100, 20.0), (None, None), (None, 50.0), (2000, 500.0))
    """
    text = (os.environ.get(ENV_VAR, "") if value is None else value).strip()
    if not text:
        return DEFAULT_LINES, DEFAULT_RATE
    if text.lower() in ("off", "none", "no"):
        return None, None
    words = [word.strip() for word in text.split(",")]
    try:
        if len(words) > 2:
            raise ValueError
        lines = int(words[0])
        rate = float(words[1]) if len(words) == 2 else DEFAULT_RATE
    except ValueError:
        raise ValueError(
            f"{ENV_VAR}={text!r} is not LINES or LINES,RATE (such as '2000,500'), nor 'off': it caps the lines each rank writes "
            f"into the cell. Set it to e.g. '2000,500', or 'off' for every line."
        ) from None
    return (lines if lines > 0 else None), (rate if rate > 0 else None)


@dataclass
class _Budget:
    """One rank's count this launch: lines shown, held, the rate bucket, and the latest held lines."""

    tokens: float
    refilled_at: float
    shown: int = 0
    held: int = 0
    noticed: bool = False
    tail: collections.deque[tuple[str, str]] = field(default_factory=collections.deque)


class LineCap:
    """Per-rank budget of lines written into the cell (see the module doc).

    Args:
        max_lines: lines of each rank written per launch; None: no limit.
        max_rate: lines of each rank written per second (bursts of one second's worth); None: no limit.
        tail: a rank's last lines held back, kept to show at the end.
        clock: seconds, monotonic (tests pass a fake one).
    """

    def __init__(
        self,
        max_lines: int | None = DEFAULT_LINES,
        max_rate: float | None = DEFAULT_RATE,
        tail: int = DEFAULT_TAIL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_lines = max_lines
        self.max_rate = max_rate
        self.tail_lines = tail
        self.clock = clock
        self._budgets: dict[int, _Budget] = {}

    @property
    def limited(self) -> bool:
        return self.max_lines is not None or self.max_rate is not None

    def reset(self) -> None:
        """A new launch (or attempt): every rank starts with a full budget."""
        self._budgets = {}

    def admit(self, rank: int, stream: str, lines: list[str]) -> tuple[int, str | None]:
        """How many of ``lines`` (from the first) go into the cell; the rest are held back.

        The second value is the reason, the first time this rank has lines held back (the
        notice to print once), else None.
        """
        budget = self._budget(rank)
        allowed, reason = len(lines), None
        if self.max_lines is not None and budget.shown + allowed > self.max_lines:
            allowed = max(self.max_lines - budget.shown, 0)
            reason = f"more than {self.max_lines:,} lines: the rest of this launch's are held back from the cell"
        if self.max_rate is not None:
            self._refill(budget)
            if allowed > budget.tokens:
                allowed = int(budget.tokens)
                reason = reason or f"more than {self.max_rate:g} lines a second: lines are held back from the cell while it prints that fast"
            budget.tokens -= allowed
        if allowed:
            budget.shown += allowed
            budget.tail.clear()  # lines shown after a gap: the earlier held ones are older news (in the log)
        held = len(lines) - allowed
        if held:
            budget.held += held
            budget.tail.extend((stream, line) for line in lines[max(allowed, len(lines) - self.tail_lines) :])
            while len(budget.tail) > self.tail_lines:
                budget.tail.popleft()
        first_notice = reason if held and not budget.noticed else None
        budget.noticed = budget.noticed or bool(held)
        return allowed, first_notice

    def held(self, rank: int) -> int:
        """Lines of ``rank`` held back from the cell this launch."""
        budget = self._budgets.get(rank)
        return budget.held if budget is not None else 0

    def shown(self, rank: int) -> int:
        budget = self._budgets.get(rank)
        return budget.shown if budget is not None else 0

    def tail(self, rank: int) -> list[tuple[str, str]]:
        """``rank``'s latest lines held back (``(stream, line)``), none if lines were shown since."""
        budget = self._budgets.get(rank)
        return list(budget.tail) if budget is not None else []

    def held_ranks(self) -> list[int]:
        return sorted(rank for rank, budget in self._budgets.items() if budget.held)

    def _budget(self, rank: int) -> _Budget:
        budget = self._budgets.get(rank)
        if budget is None:
            budget = self._budgets[rank] = _Budget(tokens=self.max_rate or 0.0, refilled_at=self.clock())
        return budget

    def _refill(self, budget: _Budget) -> None:
        assert self.max_rate is not None
        now = self.clock()
        budget.tokens = min(self.max_rate, budget.tokens + (now - budget.refilled_at) * self.max_rate)
        budget.refilled_at = now
