"""How fast the live view may update in each frontend, and the budget that holds it to that.

Every widget update is one comm message, and each one is a round through the frontend's
renderer. JupyterLab and Notebook 7 (and the classic Notebook) take what nbaccel sends today:
each rank's panel at most every 50 ms. VS Code's and Colab's renderers stall at such rates
(Lightning caps its bar in Colab, Lightning #5514; VS Code takes seconds for a few dozen widget
messages over a remote link, vscode-jupyter #7965), so there the whole view of a launch, all its
widgets together, gets at most ``view_rate`` messages a second (Kaggle too, by construction: its
renderer was not run here). The view spends them in order of importance (the ranks' states
first, then the panel pushed longest ago) and coalesces what waits: a panel pushed late sends
its newest lines once, not once per line. The lines themselves are never dropped: each rank's
log file has all of them, and the view's history cap (``max_lines``) says what it no longer shows.

Example:
    >>> policy_for("vscode").view_rate, policy_for("jupyterlab").view_rate
    (10.0, None)
    >>> budget = MessageBudget(rate=10.0, now=0.0)
    >>> budget.ready(0.0), budget.spend(3), budget.ready(0.1), budget.wait(0.1)
    (True, None, False, 0.2)
"""

from __future__ import annotations

from dataclasses import dataclass

from nbaccel.output import frontend


@dataclass(frozen=True)
class UpdatePolicy:
    """The live view's pace in one frontend.

    Attributes:
        frontend: the frontend's name (``nbaccel.output.frontend.FRONTENDS``).
        interval: least seconds between two pushes of one rank's panel.
        view_rate: most widget messages a second for the whole view (None: no cap beyond ``interval``).
        max_lines: lines each rank's panel keeps in the browser (every line stays in the log file).
    """

    frontend: str
    interval: float = 0.05
    view_rate: float | None = None
    max_lines: int = 500

    def __post_init__(self) -> None:
        if self.view_rate is not None and not self.view_rate > 0:
            raise ValueError(f"view_rate must be a positive number of messages a second, or None; got {self.view_rate!r}")
        if not self.interval >= 0:
            raise ValueError(f"interval must be seconds >= 0, got {self.interval!r}")


#: What VS Code, Colab and Kaggle get: about 10 widget messages a second per launch view.
CAPPED_RATE = 10.0
CAPPED_MAX_LINES = 200  # each rank's panel resends its newest block of these: keep the browser light

_POLICIES = {
    frontend.VSCODE: UpdatePolicy(frontend.VSCODE, interval=0.1, view_rate=CAPPED_RATE, max_lines=CAPPED_MAX_LINES),
    frontend.COLAB: UpdatePolicy(frontend.COLAB, interval=0.1, view_rate=CAPPED_RATE, max_lines=CAPPED_MAX_LINES),
    frontend.KAGGLE: UpdatePolicy(frontend.KAGGLE, interval=0.1, view_rate=CAPPED_RATE, max_lines=CAPPED_MAX_LINES),
}


def policy_for(name: str) -> UpdatePolicy:
    """The pace of frontend ``name``; JupyterLab's for the others (classic Notebook, JupyterLab,
    Notebook 7, and a view asked for with ``--widgets`` where no frontend was recognised).

    >>> policy_for("colab").max_lines, policy_for("classic").interval
    (200, 0.05)
    """
    return _POLICIES.get(name, UpdatePolicy(name))


class MessageBudget:
    """A token bucket of widget messages: ``rate`` a second, at most ``burst`` saved up.

    The view asks ``ready(now)`` before a push and ``spend(n)`` after it with the messages the push
    sent; a push may overdraw (its size is known only once made), and the debt is paid by waiting,
    so over any stretch the view sends at most ``rate`` a second plus one push.
    """

    def __init__(self, rate: float, now: float, burst: float = 2.0) -> None:
        self.rate = rate
        self.burst = max(1.0, burst)
        self.tokens = 1.0
        self._at = now
        self.spent = 0  # messages sent through the budget, all told

    def _refill(self, now: float) -> None:
        if now > self._at:
            self.tokens = min(self.burst, self.tokens + (now - self._at) * self.rate)
            self._at = now

    def ready(self, now: float) -> bool:
        """Whether a push may go now (a whole message is saved up)."""
        self._refill(now)
        return self.tokens >= 1.0

    def spend(self, messages: int) -> None:
        self.tokens -= messages
        self.spent += messages

    def wait(self, now: float) -> float:
        """Seconds until ``ready`` (0.0 when it is now)."""
        self._refill(now)
        return round(max(0.0, (1.0 - self.tokens) / self.rate), 9)
