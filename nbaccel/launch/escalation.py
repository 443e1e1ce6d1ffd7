"""How nbaccel stops ranks: each kind of stop's signals, sent in turn on the owner's clock.

The kernel's event loop (every rank of a one-node launch) and a node's agent (its local ranks
of a cluster's launch) both stop ranks with ``STOP_PLANS`` and an ``Escalation``, so a stop,
a timeout and an interrupt go the same way on one machine and across nodes.

Example:
    >>> sent = []
    >>> steps = Escalation(lambda sig, targets: sent.append((signal.Signals(sig).name, targets)))
    >>> steps.start(STOP_PLANS["stopped"], [0, 1], now=10.0)
    >>> sent, steps.next_at()
    ([('SIGTERM', [0, 1])], 11.0)
    >>> steps.fire(11.0)
    >>> sent[-1], steps.next_at()
    (('SIGKILL', [0, 1]), None)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Sequence

__all__ = ["LINGER", "STOP_PLANS", "Escalation", "StopPlan"]

StopPlan = Sequence[tuple[float, int]]  # (delay from the start of a stop, signal)

# Keyed by the stop's reason, in Status's words ("stopped", "timed out", "interrupted"), and
# "closing" for an agent whose cluster is going away. An interrupt asks first (SIGINT: the
# user's KeyboardInterrupt handlers run), then insists.
STOP_PLANS: dict[str, StopPlan] = {
    "stopped": [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
    "timed out": [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
    "interrupted": [(0.0, signal.SIGINT), (2.0, signal.SIGTERM), (3.5, signal.SIGKILL)],
    "closing": [(0.0, signal.SIGTERM), (1.0, signal.SIGKILL)],
}
LINGER = 3.0  # seconds a rank that reported its own error may take to exit by itself

Send = Callable[[int, list[int]], None]  # (signal, targets): the owner sends it


class Escalation:
    """Timed signals: each (delay, signal) of a plan sent to its targets in turn.

    The owner calls ``fire`` on its clock and waits no longer than ``next_at``; a signal whose
    delay is 0 goes at once.
    """

    def __init__(self, send: Send) -> None:
        self._send = send
        self._due: list[tuple[float, int, list[int]]] = []  # (when, signal, targets), soonest first

    def start(self, plan: StopPlan, targets: Iterable[int], *, keep: bool = False, now: float | None = None) -> None:
        """Send ``plan`` to ``targets``; it replaces any escalation under way unless ``keep``."""
        start = time.monotonic() if now is None else now
        chosen = list(targets)
        if not keep:
            self._due = []
        for delay, sig in plan:
            if delay <= 0:
                self._send(sig, chosen)
            else:
                self._due.append((start + delay, sig, chosen))
        self._due.sort(key=lambda entry: entry[0])

    def next_at(self) -> float | None:
        """When the next timed signal is due (None: none is)."""
        return self._due[0][0] if self._due else None

    def fire(self, now: float) -> None:
        """Send every signal due by ``now``."""
        while self._due and self._due[0][0] <= now:
            _, sig, targets = self._due.pop(0)
            self._send(sig, targets)
