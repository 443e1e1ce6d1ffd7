"""LiveViewSink: the live view of a launch in a notebook, one tab per rank taking part, the lowest first.

Every sink call only changes Python state (cheap); a rank's widgets are pushed at most every
``interval`` seconds (20 updates/s by default), every line kept and in order. Where the
frontend's renderer takes fewer messages (VS Code, Colab: ``nbaccel.output.update_policy``), the
whole view also keeps within ``view_rate`` widget messages a second: state words first, then the
panel pushed longest ago, each push sending everything that waited in one go. Every push happens
in a sink call, on the thread that runs the launch (the kernel's main thread: Colab renders no
widget update sent from another, colabtools #3373). Pushes happen in
the sink calls themselves when a rank is due; lines held back, and the elapsed-time clock, wait
for ``tick()``, which the kernel's event loop calls when ``tick_in()`` says (the loop sleeps
until a pipe has data, so without that tick the last lines before a quiet spell would wait for
the next one). The sink has no thread and no clock of its own.

The view ends (``launch_finished``, or the first tick after the last rank taking part has
finished) by replacing the widget's display with a static HTML + text view of every rank (see
``static_view``) and closing the widgets: the saved notebook shows what happened without widget
state, and a kernel that launches hundreds of times keeps no widgets around. The end waits for
that tick because a persistent worker's answer comes on its channel, which the kernel reads
before the stdout pipe: the lines it printed just before answering are read right after, in the
same wake-up of the loop. ``launch_finished`` comes after every launch, however it ended
(interrupts and timeouts included), so no view is left live.

The full logs (``RankLogSink``) and the text shown if this view breaks (``TextFallback``) are
sinks of their own; ``nbaccel.output.choose.WidgetSink`` puts the three together.

Example:
    >>> view = LiveViewSink(publisher=RecordingPublisher())
    >>> view.launch_started(2, attempt=0)
    >>> view.output(0, "stdout", ["hello"])
    >>> view.rank_finished(RankOutcome(0, Status.SUCCEEDED))
    >>> view.rank_finished(RankOutcome(1, Status.SUCCEEDED))
    >>> view.tick_in()  # every rank has ended: the next tick ends the view
    0.0
    >>> view.tick()
    >>> kind, bundle, _ = view.publisher.calls[-1]
    >>> kind, bundle["text/plain"].startswith("nbaccel: 2 ranks, done in")
    ('update', True)
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from nbaccel.launch.outcome import RankOutcome, Status
from nbaccel.output.resource_words import peak_words, resource_words
from nbaccel.output.status_words import RUNNING, elapsed_words, failure_headline, rank_state
from nbaccel.output.stragglers import wall_straggler
from nbaccel.output.update_policy import MessageBudget, UpdatePolicy
from nbaccel.output.widgets.live_view import LaunchView, ranks_words
from nbaccel.output.widgets.rank_panel import tree_size as _tree_size
from nbaccel.output.widgets.static_view import static_bundle
from nbaccel.wire import rich

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"
CLOCK_PERIOD = 1.0  # seconds between two updates of the elapsed time


class Publisher(Protocol):
    """Where the launch's output is displayed (IPython's display machinery in a kernel)."""

    def show(self, bundle: dict[str, Any], display_id: str) -> None: ...

    def update(self, bundle: dict[str, Any], display_id: str) -> None: ...


class IPythonPublisher:
    """Displays into the cell that is running (``display_data`` / ``update_display_data``)."""

    def show(self, bundle: dict[str, Any], display_id: str) -> None:
        from IPython.display import display

        display(bundle, raw=True, display_id=display_id)  # type: ignore[no-untyped-call]

    def update(self, bundle: dict[str, Any], display_id: str) -> None:
        from IPython.display import update_display

        update_display(bundle, raw=True, display_id=display_id)  # type: ignore[no-untyped-call]


class RecordingPublisher:
    """Keeps what would be displayed: ``("show" | "update", bundle, display_id)`` (no frontend)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any], str]] = []

    def show(self, bundle: dict[str, Any], display_id: str) -> None:
        self.calls.append(("show", bundle, display_id))

    def update(self, bundle: dict[str, Any], display_id: str) -> None:
        self.calls.append(("update", bundle, display_id))


class LogFiles(Protocol):
    """Where the ranks' full logs are (``nbaccel.output.logdir.RankLogSink``)."""

    @property
    def folder(self) -> Path | None: ...

    def file_for(self, rank: int) -> Path | None: ...


class LiveViewSink:
    """Live per-rank widgets, coalesced and capped, replaced by a static view at the end.

    Args:
        max_lines: lines each rank's panel keeps in the browser (older ones stay in the log;
            default: the policy's).
        max_displays: rich outputs (figures, tables) each panel keeps.
        interval: least seconds between two pushes of one rank's panel (default: the policy's).
        publisher: where the view is displayed (default: IPython's display, into the cell).
        logs: the launch's log files, named in the view (read at each ``launch_started``).
        clock: seconds, monotonic (``time.monotonic``; tests pass a fake one).
        policy: the frontend's pace (``update_policy.policy_for``; default: JupyterLab's, no
            view-wide message cap).
    """

    def __init__(
        self,
        max_lines: int | None = None,
        max_displays: int = 20,
        interval: float | None = None,
        publisher: Publisher | None = None,
        logs: LogFiles | None = None,
        clock: Callable[[], float] = time.monotonic,
        policy: UpdatePolicy | None = None,
    ) -> None:
        self.policy = policy or UpdatePolicy("jupyterlab")
        self.max_lines = self.policy.max_lines if max_lines is None else max_lines
        self.max_displays = max_displays
        self.interval = self.policy.interval if interval is None else interval
        self.publisher = publisher or IPythonPublisher()
        self.logs = logs
        self.clock = clock
        self.view: LaunchView | None = None
        self.display_id: str | None = None
        self.finished = True
        self._started_at = 0.0
        self._last_push: dict[int, float] = {}
        self._last_clock = 0.0
        self._finished_ranks: set[int] = set()
        self._all_finished = False  # every rank taking part has ended: the next tick ends the view
        self._outcomes: dict[int, RankOutcome] = {}
        self._elapsed: dict[int, float] = {}  # seconds from launch to each rank's end (the saved bundle)
        self._nodes: dict[int, str] = {}  # where each rank runs, across nodes (the saved bundle)
        self._budget: MessageBudget | None = None  # the view's messages a second, where the frontend caps them
        self.messages = 0  # widget messages this sink's pushes sent (opens, updates, closes), all launches

    # -- the Sink protocol -------------------------------------------------------------------

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self._finish()  # a previous attempt that ended without launch_finished
        self.view = self._new_view(num_processes, attempt, ranks)
        self.finished = False
        self._started_at = self._last_clock = self.clock()
        self._last_push = {}
        self._finished_ranks = set()
        self._all_finished = False
        self._outcomes = {}
        self._elapsed = {}
        self._nodes = {}
        rate = self.policy.view_rate
        self._budget = MessageBudget(rate, self._started_at) if rate is not None else None
        self.display_id = f"nbaccel-{uuid.uuid4().hex}"
        self.messages += _tree_size(self.view.root)
        self.publisher.show(self._live_bundle(), self.display_id)

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        if self.view is None or self.finished:
            return
        self._mark_running(rank)
        self.view.panel(rank).add_lines(stream, lines)
        self._push_due(self.clock())

    def event(self, rank: int, event: dict[str, Any]) -> None:
        if self.view is None or self.finished:
            return
        kind = event.get("type")
        if kind == rich.NODE:  # where the rank runs, before it runs: the tab says it
            self._nodes[rank] = f"node {event.get('node')} ({event.get('host')})"
            self.view.set_node(rank, f"node {event.get('node')}")
            self._push_due(self.clock())
            return
        if kind == rich.CLOCK:  # a node's clock offset, for a profile's merge: nothing to show here
            return
        if kind == rich.RESOURCES:  # sampled by the kernel: the chip says it, the rank's state is unchanged
            self.view.peaks[rank] = max(self.view.peaks.get(rank, 0), int(event.get("peak_rss") or 0))
            if event.get("peak_gpu_mem") is not None:
                self.view.gpu_peaks[rank] = max(self.view.gpu_peaks.get(rank, 0), int(event["peak_gpu_mem"]))
            if event.get("cpu_time") is not None:
                self.view.cpu_times[rank] = float(event["cpu_time"])
            self.view.set_resources(rank, resource_words(event))
            self._push_due(self.clock())
            return
        self._mark_running(rank)
        panel = self.view.panel(rank)
        if kind == rich.DISPLAY:
            panel.add_display(event)
        elif kind == rich.CLEAR_OUTPUT:
            panel.clear(bool(event.get("wait")))
        elif kind == rich.PROGRESS:
            panel.set_progress(event)
        elif kind != rich.STARTED:
            text = rich.plain_text(event)  # a newer rank's event: its text, if any
            if text:
                panel.add_lines("stdout", text.splitlines())
        self._push_due(self.clock())

    def rank_finished(self, outcome: RankOutcome) -> None:
        if self.view is None or self.finished:
            return
        rank = outcome.rank
        first_failure = outcome.is_failure and not any(o.is_failure for o in self._outcomes.values())
        self._outcomes[rank] = outcome
        self._finished_ranks.add(rank)
        self._elapsed[rank] = self.clock() - self._started_at
        self.view.set_state(rank, rank_state(outcome))
        if outcome.is_failure:
            self.view.panel(rank).set_failure(outcome)
        if first_failure:
            self.view.set_banner(f"{failure_headline(outcome)} (its traceback is at the top of the rank {rank} tab)")
        now = self.clock()
        if self._budget is None:
            self.messages += self.view.flush_labels()
            self._push(rank, now)
        else:
            self._push_due(now)  # within the budget; the view's end sends the rest
        self._all_finished = self._finished_ranks.issuperset(self.view.ranks)

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        self._finish(outcomes)

    def tick_in(self) -> float | None:
        """Seconds until ``tick()`` has something to do (a rank's held lines, the clock, the end);
        None once the view has ended."""
        if self.view is None or self.finished:
            return None
        if self._all_finished:
            return 0.0
        now = self.clock()
        moments = [self._last_clock + CLOCK_PERIOD]
        waiting = [self._last_push.get(r, 0.0) + self.interval for r, p in self.view.panels.items() if p.has_changes]
        if self._budget is None:
            moments += waiting
        elif waiting or self.view.labels_pending:
            moments.append(max(now + self._budget.wait(now), min(waiting, default=now)))
        return max(0.0, min(moments) - now)

    def tick(self) -> None:
        """Push every rank that is due, and the clock; or end the view once every rank taking
        part has finished."""
        if self.view is None or self.finished:
            return
        if self._all_finished:
            self._finish()
            return
        now = self.clock()
        if self._last_clock + CLOCK_PERIOD <= now:
            self._last_clock = now
            self.view.set_clock(f"running · {elapsed_words(now - self._started_at)}")
        self._push_due(now)

    # -- pushing -----------------------------------------------------------------------------

    def _push_due(self, now: float) -> None:
        assert self.view is not None
        if self._budget is not None:
            self._spend(now, self._budget)
            return
        self.messages += self.view.flush_labels()
        for rank, panel in list(self.view.panels.items()):
            # The same sum as tick_in's: a tick it calls due is never found early by a rounding.
            if panel.has_changes and self._last_push.get(rank, 0.0) + self.interval <= now:
                self._push(rank, now)

    def _spend(self, now: float, budget: MessageBudget) -> None:
        """Push within the frontend's budget: the labels (states) first, then the due panels,
        the one pushed longest ago first (rank order among equals), while messages are left."""
        assert self.view is not None
        if not budget.ready(now):
            return
        if self.view.labels_pending:
            sent = self.view.flush_labels()
            budget.spend(sent)
            self.messages += sent
        due = [r for r, p in self.view.panels.items() if p.has_changes and self._last_push.get(r, 0.0) + self.interval <= now]
        for rank in sorted(due, key=lambda r: (self._last_push.get(r, 0.0), r)):
            if not budget.ready(now):
                return
            budget.spend(self._push(rank, now))

    def _push(self, rank: int, now: float) -> int:
        assert self.view is not None
        self._last_push[rank] = now
        sent = self.view.panel(rank).sync()
        self.messages += sent
        return sent

    def _mark_running(self, rank: int) -> None:
        assert self.view is not None
        self.view.panel(rank)
        if rank not in self._finished_ranks and self.view.states[rank] != RUNNING:
            self.view.set_state(rank, RUNNING)

    # -- the start and the end -------------------------------------------------------------------

    def _new_view(self, num_processes: int, attempt: int, ranks: Sequence[int] | None) -> LaunchView:
        logs = self.logs
        folder = logs.folder if logs is not None else None

        def log_file(rank: int) -> str | None:
            path = logs.file_for(rank) if logs is not None else None
            return str(path) if path is not None else None

        return LaunchView(
            num_processes,
            attempt,
            log_dir=str(folder) if folder is not None else None,
            log_files=log_file if folder is not None else None,
            max_lines=self.max_lines,
            max_displays=self.max_displays,
            ranks=ranks,
        )

    def _finish(self, outcomes: list[RankOutcome] | None = None) -> None:
        """Replace the live view by the static one and close the widgets (once per attempt)."""
        if self.view is None or self.finished:
            return
        self.finished = True
        view = self.view
        for outcome in outcomes or []:
            if outcome.rank not in self._finished_ranks and outcome.status is not Status.RUNNING:
                self._outcomes[outcome.rank] = outcome
                view.set_state(outcome.rank, rank_state(outcome))
        if self._budget is None:  # a capped frontend is spared pushes the static view replaces at once
            self.messages += view.flush_labels()
            for panel in view.panels.values():
                self.messages += panel.sync()
        for rank, peak in view.peaks.items():  # the saved view keeps each rank's peak, not its last sample
            view.resources[rank] = peak_words({"peak_rss": peak, "peak_gpu_mem": view.gpu_peaks.get(rank), "cpu_time": view.cpu_times.get(rank)})
        summary = self._summary(self.clock() - self._started_at)
        straggler = wall_straggler(self._elapsed)
        if straggler:
            summary = f"{summary}; {straggler}"
        view.set_clock(summary)
        try:
            assert self.display_id is not None
            self.publisher.update(static_bundle(view, summary, elapsed=self._elapsed, nodes=self._nodes), self.display_id)
        finally:
            view.close()

    def _summary(self, elapsed: float) -> str:
        assert self.view is not None
        states = list(self.view.states.values())
        failed = [s for s in states if s.is_failure]
        if failed:
            return f"failed after {elapsed_words(elapsed)}"
        # Done means every rank taking part is; an idle worker that printed has no task to end.
        if all(self.view.states[r].kind == "done" for r in self.view.ranks):
            return f"done in {elapsed_words(elapsed)}"
        if any(s.short == "interrupted" for s in states):
            return f"interrupted after {elapsed_words(elapsed)}"
        if any(s.short == "timed out" for s in states):
            return f"timed out after {elapsed_words(elapsed)}"
        return f"ended after {elapsed_words(elapsed)}"

    def _live_bundle(self) -> dict[str, Any]:
        assert self.view is not None
        ranks = ranks_words(self.view.ranks, self.view.num_processes)
        return {
            WIDGET_VIEW_MIME: {"model_id": self.view.root.model_id, "version_major": 2, "version_minor": 0},
            "text/plain": f"nbaccel: {ranks} running (a live view needs a frontend with ipywidgets; the result replaces this line)",
        }
