"""WidgetSink: the live view of a launch in a notebook, one tab per rank taking part, the lowest first.

Every sink call only changes Python state (cheap); a rank's widgets are pushed at most every
``interval`` seconds (20 updates/s by default), every line kept and in order. Pushes happen in
the sink calls themselves when a rank is due, and otherwise from a small ticker thread that
also drives the elapsed-time clock: the supervisor's loop sleeps until a pipe has data, so
without the ticker the last lines before a quiet spell would wait for the next one. A caller
with a loop of its own may drive ``tick()`` instead (``ticker=False``).

At the end (``launch_finished``, or the first tick after the last rank taking part has finished,
which also covers timeouts and interrupts) the widget's display is replaced by a static HTML + text view of every rank
(see ``static_view``) and the widgets are closed: the saved notebook shows what happened
without widget state, and a kernel that launches hundreds of times keeps no widgets around.
The full output of every rank is in a per-launch log folder (see ``logdir``). The end waits for
that tick because a persistent worker's answer comes on its channel, which the kernel reads
before the stdout pipe: the lines it printed just before answering are read right after.

Example::

    notebook_launcher(train, num_processes=4, output=WidgetSink())
"""

from __future__ import annotations

import functools
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nbaccel.launch.outcome import RankOutcome, Status
from nbaccel.wire import rich
from nbaccel.output.widgets.live_view import LaunchView, ranks_words
from nbaccel.output.logdir import DEFAULT_KEEP, LaunchLogs
from nbaccel.output.text import RichTextSink
from nbaccel.output.widgets.static_view import static_bundle
from nbaccel.output.status_words import RUNNING, elapsed_words, failure_headline, rank_state

WIDGET_VIEW_MIME = "application/vnd.jupyter.widget-view+json"

F = TypeVar("F", bound=Callable[..., None])


def _text_if_broken(method: F) -> F:
    """A failure of the view must never fail the launch: the rest of it is shown as text."""

    @functools.wraps(method)
    def wrapper(self: WidgetSink, *args: Any, **kwargs: Any) -> None:
        if self._fallback is None:
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - any bug or comm failure in the view
                self._fall_back(exc)
        assert self._fallback is not None
        getattr(self._fallback, method.__name__)(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class Publisher(Protocol):
    """Where the launch's output is displayed (IPython's display machinery in a kernel)."""

    def show(self, bundle: dict[str, Any], display_id: str) -> None: ...

    def update(self, bundle: dict[str, Any], display_id: str) -> None: ...


class IPythonPublisher:
    """Displays into the cell that is running (``display_data`` / ``update_display_data``)."""

    def show(self, bundle: dict[str, Any], display_id: str) -> None:
        from IPython.display import display

        display(bundle, raw=True, display_id=display_id)

    def update(self, bundle: dict[str, Any], display_id: str) -> None:
        from IPython.display import update_display

        update_display(bundle, raw=True, display_id=display_id)


class WidgetSink:
    """Live per-rank widgets, coalesced, capped, with full logs and a static view at the end.

    Args:
        max_lines: lines each rank's panel keeps in the browser (older ones stay in the log).
        max_displays: rich outputs (figures, tables) each panel keeps.
        interval: least seconds between two pushes of one rank's panel.
        log_root: parent folder of the per-launch log folders (default: see ``logdir``);
            ``False`` keeps no logs.
        keep_launches: launch folders kept under ``log_root``.
        publisher: where the view is displayed (default: IPython's display, into the cell).
        ticker: run the thread that pushes late lines and the clock (else call ``tick()``).
    """

    def __init__(
        self,
        max_lines: int = 500,
        max_displays: int = 20,
        interval: float = 0.05,
        log_root: Path | str | bool | None = None,
        keep_launches: int = DEFAULT_KEEP,
        publisher: Publisher | None = None,
        ticker: bool = True,
    ) -> None:
        self.max_lines = max_lines
        self.max_displays = max_displays
        self.interval = interval
        self.publisher = publisher or IPythonPublisher()
        self.view: LaunchView | None = None
        self.logs: LaunchLogs | None = None
        self.display_id: str | None = None
        self.finished = True
        self._log_root = log_root
        self._keep = keep_launches
        self._use_ticker = ticker
        self._ticker: _Ticker | None = None
        self._lock = threading.RLock()
        self._started_at = 0.0
        self._last_push: dict[int, float] = {}
        self._last_clock = 0.0
        self._finished_ranks: set[int] = set()
        self._all_finished = False  # every rank taking part has ended: the next tick ends the view
        self._outcomes: dict[int, RankOutcome] = {}
        self._elapsed: dict[int, float] = {}  # seconds from launch to each rank's end
        self._cell_hook: Any = None
        self._fallback: RichTextSink | None = None

    # -- the Sink protocol -------------------------------------------------------------------

    @_text_if_broken
    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self._finish()  # a previous attempt that ended without launch_finished
        with self._lock:
            self._open_logs(attempt)
            logs = self.logs
            self.view = LaunchView(
                num_processes, attempt, log_dir=str(logs.path) if logs else None,
                log_files=(lambda rank: str(logs.file_for(rank))) if logs else None,
                max_lines=self.max_lines, max_displays=self.max_displays, ranks=ranks,
            )
            self.finished = False
            self._started_at = self._last_clock = time.monotonic()
            self._last_push = {}
            self._finished_ranks = set()
            self._all_finished = False
            self._outcomes = {}
            self._elapsed = {}
            self.display_id = f"nbaccel-{uuid.uuid4().hex}"
            self.publisher.show(self._live_bundle(), self.display_id)
            self._watch_cell_end()
        if self._use_ticker:
            self._ticker = _Ticker(self, self.interval)
            self._ticker.start()

    @_text_if_broken
    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        with self._lock:
            if self.view is None or self.finished:
                return
            if self.logs is not None:
                self.logs.write(rank, lines)
            self._mark_running(rank)
            self.view.panel(rank).add_lines(stream, lines)
            self._push_due(time.monotonic())

    @_text_if_broken
    def event(self, rank: int, event: dict[str, Any]) -> None:
        with self._lock:
            if self.view is None or self.finished:
                return
            self._mark_running(rank)
            panel = self.view.panel(rank)
            kind = event.get("type")
            if kind == rich.DISPLAY:
                panel.add_display(event)
                self._log_event(rank, event)
            elif kind == rich.CLEAR_OUTPUT:
                panel.clear(bool(event.get("wait")))
            elif kind == rich.PROGRESS:
                panel.set_progress(event)
                if event.get("closed") and event.get("leave", True):
                    self._log_event(rank, event)
            elif kind != rich.STARTED:
                text = rich.plain_text(event)  # a newer rank's event: its text, if any
                if text:
                    panel.add_lines("stdout", text.splitlines())
            self._push_due(time.monotonic())

    @_text_if_broken
    def rank_finished(self, outcome: RankOutcome) -> None:
        with self._lock:
            if self.view is None or self.finished:
                return
            rank = outcome.rank
            first_failure = outcome.is_failure and not any(o.is_failure for o in self._outcomes.values())
            self._outcomes[rank] = outcome
            self._finished_ranks.add(rank)
            self._elapsed[rank] = time.monotonic() - self._started_at  # the saved bundle's per-rank time
            self.view.set_state(rank, rank_state(outcome))
            if outcome.is_failure:
                self.view.panel(rank).set_failure(outcome)
            if first_failure:
                self.view.set_banner(f"{failure_headline(outcome)} (its traceback is at the top of the rank {rank} tab)")
            self._push(rank, time.monotonic())
            self._all_finished = self._finished_ranks.issuperset(self.view.ranks)

    @_text_if_broken
    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        self._finish(outcomes)

    # -- pushing -----------------------------------------------------------------------------

    def tick(self) -> None:
        """Push every rank that is due, and the clock, or end the view once every rank taking part
        has finished; what the ticker thread (or the kernel's event loop) calls.

        Example:
            >>> sink.rank_finished(RankOutcome(0, Status.SUCCEEDED))  # doctest: +SKIP
            >>> sink.tick()  # the static view replaces the widgets  # doctest: +SKIP
        """
        with self._lock:
            if self.view is None or self.finished:
                return
            if not self._all_finished:
                now = time.monotonic()
                self._push_due(now)
                if now - self._last_clock >= 1.0:
                    self._last_clock = now
                    self.view.set_clock(f"running · {elapsed_words(now - self._started_at)}")
                return
        self._finish()  # outside the lock: it stops the ticker, which may be waiting for the lock

    def tick_in(self) -> float | None:
        """Seconds until ``tick()`` has something to do (a rank's held lines, the clock); None
        once the launch has ended. For a caller that drives ``tick()`` from its own loop."""
        with self._lock:
            if self.view is None or self.finished:
                return None
            if self._all_finished:
                return 0.0
            now = time.monotonic()
            moments = [self._last_clock + 1.0]
            moments += [self._last_push.get(r, 0.0) + self.interval for r, p in self.view.panels.items() if p.has_changes]
            return max(0.0, min(moments) - now)

    def _push_due(self, now: float) -> None:
        assert self.view is not None
        for rank, panel in list(self.view.panels.items()):
            if panel.has_changes and now - self._last_push.get(rank, 0.0) >= self.interval:
                self._push(rank, now)

    def _push(self, rank: int, now: float) -> None:
        assert self.view is not None
        self._last_push[rank] = now
        self.view.panel(rank).sync()

    def _mark_running(self, rank: int) -> None:
        assert self.view is not None
        self.view.panel(rank)
        if rank not in self._finished_ranks and self.view.states[rank] != RUNNING:
            self.view.set_state(rank, RUNNING)

    # -- the end -------------------------------------------------------------------------------

    def _finish(self, outcomes: list[RankOutcome] | None = None) -> None:
        """Replace the live view by the static one and close the widgets (once per attempt)."""
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()  # outside the lock: the ticker may be waiting for it
        with self._lock:
            if self.view is None or self.finished:
                return
            self.finished = True
            view = self.view
            for outcome in outcomes or []:
                if outcome.rank not in self._finished_ranks and outcome.status is not Status.RUNNING:
                    self._outcomes[outcome.rank] = outcome
                    view.set_state(outcome.rank, rank_state(outcome))
            for panel in view.panels.values():
                panel.sync()
            summary = self._summary(time.monotonic() - self._started_at)
            view.set_clock(summary)
            if self.logs is not None:
                self.logs.close()  # flushes; the folder may be pruned by later launches from now on
            try:
                assert self.display_id is not None
                self.publisher.update(static_bundle(view, summary, elapsed=self._elapsed), self.display_id)
            finally:
                view.close()
                self._unwatch_cell_end()

    def close(self) -> None:
        """End the view now if it is still live (the cell ended without launch_finished)."""
        try:
            self._finish()
        except Exception as exc:  # noqa: BLE001 - called from IPython's post_run_cell hook
            self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.stop()
        self.finished = True
        self._unwatch_cell_end()
        if self.logs is not None:
            self.logs.close()
        self._fallback = RichTextSink()
        print(
            f"nbaccel: the live widget view failed ({type(exc).__name__}: {exc}); the rest of this launch is shown "
            "as text. Please report this; output='text' avoids the widget view.",
            file=sys.stderr,
        )

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

    def _open_logs(self, attempt: int) -> None:
        if self._log_root is False:
            return
        if self.logs is None:
            root = None if self._log_root in (None, True) else Path(str(self._log_root))
            self.logs = LaunchLogs.create(root, keep=self._keep)
        else:
            self.logs.reopen(attempt)

    def _log_event(self, rank: int, event: dict[str, Any]) -> None:
        text = rich.plain_text(event)
        if self.logs is not None and text:
            self.logs.write(rank, text.splitlines())

    def _watch_cell_end(self) -> None:
        """Finish the view when the cell ends, whatever happened (a second interrupt, say)."""
        try:
            from IPython import get_ipython
        except ImportError:
            return
        shell = get_ipython()
        if shell is None:
            return

        def on_cell_end(*_: Any) -> None:
            self.close()

        shell.events.register("post_run_cell", on_cell_end)
        self._cell_hook = (shell, on_cell_end)

    def _unwatch_cell_end(self) -> None:
        if self._cell_hook is None:
            return
        shell, hook = self._cell_hook
        self._cell_hook = None
        try:
            shell.events.unregister("post_run_cell", hook)
        except ValueError:
            pass


class _Ticker(threading.Thread):
    """Calls ``sink.tick()`` every ``interval`` seconds until stopped."""

    def __init__(self, sink: WidgetSink, interval: float) -> None:
        super().__init__(name="nbaccel-widget-ticker", daemon=True)
        self._sink = sink
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                self._sink.tick()
            except Exception:  # noqa: BLE001 - a failed push must not kill the clock; the next may work
                pass

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=2.0)
