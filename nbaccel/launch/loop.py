"""The one event loop of the engine: a group's output to the sink, its events to a policy, its exits to outcomes.

Every launch mode runs this loop: a one-shot launch (policy ``OneShot``), the start of persistent
workers (``Ready``) and one task on them (``Task``). The loop runs in the thread that launched
(the cell's): it waits on every source the group registered at once, with no polling sleeps and
no threads, and handles rank 0's events first whenever several are ready. It owns what every
mode shares: decoding answers and exits into ``RankOutcome``s (``nbaccel.launch.outcome``), the
deadline and what each running rank last printed when it passes, timed escalations of signals,
interrupts, and the sink's clock. A policy only decides what an event means for its mode.

Example::

    loop = EventLoop(group, sink, OneShot(), deadline=plan.deadline)
    loop.run()
    loop.outcome_list()  # every rank's RankOutcome, by rank
"""

from __future__ import annotations

import selectors
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from nbaccel.launch import warm
from nbaccel.launch.debug_desk import DEBUG_KINDS, DebugDesk
from nbaccel.launch.escalation import Escalation, StopPlan
from nbaccel.launch.outcome import RankOutcome, Status, last_line, record_answer, record_exit
from nbaccel.launch.sampler import ResourceSampler
from nbaccel.launch.seam import RankGroup, Sink
from nbaccel.wire import rich
from nbaccel.wire.events import Event, Kind

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11; annotations only, never imported

Order = tuple[int, int]  # (rank, source): rank 0 first, and its channel before its stdout


class Policy:
    """What one launch mode makes of the loop's events. Every hook may be left as it is."""

    def done(self, loop: EventLoop) -> bool:
        raise NotImplementedError

    def on_ready(self, loop: EventLoop, rank: int, info: dict[str, object]) -> None:
        """``rank`` joined its process group and waits for tasks (persistent workers)."""

    def on_answer(self, loop: EventLoop, outcome: RankOutcome, raised: bool) -> None:
        """``outcome.rank`` returned a value, or ``raised`` (its outcome holds the error)."""

    def on_exit(self, loop: EventLoop, outcome: RankOutcome) -> None:
        """``outcome.rank``'s process ended and its output was drained."""

    def on_timeout(self, loop: EventLoop) -> None:
        """The loop's deadline passed (``loop.running_at_timeout`` says where each rank was)."""

    # On an interrupt the loop re-raises at once (the caller closes the group), unless the policy
    # stops its ranks itself: then ``on_interrupt`` begins that and the loop runs on until done.
    abandons_on_interrupt = True

    def on_interrupt(self, loop: EventLoop) -> None:
        """The kernel was interrupted (only called when ``abandons_on_interrupt`` is False)."""

    def on_second_interrupt(self, loop: EventLoop) -> None:
        """Interrupted again while stopping: the loop returns after this."""

    def wake_at(self) -> float | None:
        """A time.monotonic() moment the policy wants to be woken at, if any."""
        return None

    def on_clock(self, loop: EventLoop, now: float) -> None:
        """Called after every wake-up."""


class EventLoop:
    """Runs ``policy`` over ``group`` until it is done; ``ranks``: those taking part (default all)."""

    def __init__(
        self,
        group: RankGroup,
        sink: Sink,
        policy: Policy,
        ranks: Sequence[int] | None = None,
        deadline: float | None = None,
        timeout: float | None = None,
        stall_report: float | None = None,
        sampler: ResourceSampler | None = None,
    ) -> None:
        self.group = group
        self.sink = sink
        self.policy = policy
        self.ranks = list(range(group.num_processes)) if ranks is None else list(ranks)
        self.outcomes = {rank: RankOutcome(rank) for rank in self.ranks}
        self.deadline = deadline
        self.timeout = timeout
        self.stop_reason: Status | None = None
        self.interrupted = False
        self.timed_out = False
        self.running_at_timeout: dict[int, str] = {}
        self.ended: set[int] = set()  # ranks whose exit this loop delivered
        self.stall_report = stall_report  # seconds without output after which stacks are shown once
        self._last_activity = time.monotonic()
        self._stall_shown = False
        self._escalation = Escalation(lambda sig, ranks: self.group.signal(sig, ranks))  # timed signals to ranks
        self._desk: DebugDesk | None = None  # made at a rank's first debugger prompt
        self._held_since: float | None = None  # a rank is in the debugger: the clocks stand still
        self._selector = selectors.DefaultSelector()
        self.sampler = sampler or sampler_for(group)  # each local rank's CPU and memory, once a second (a pool's: its lifetime peaks)

    # -- running ---------------------------------------------------------------------------------

    def run(self) -> None:
        """Until the policy is done. A first interrupt goes to the policy; a second ends the loop."""
        self.group.attach(self)
        try:
            try:
                self._spin()
            except KeyboardInterrupt:
                self.interrupted = True
                if self._desk is not None:
                    self._desk.interrupted()
                if self.policy.abandons_on_interrupt:
                    raise
                try:  # a second interrupt may land anywhere from here on, collecting stacks too
                    self.policy.on_interrupt(self)
                    self._spin()
                except KeyboardInterrupt:
                    self.policy.on_second_interrupt(self)
        finally:
            if self._desk is not None:
                self._desk.close()
            self.group.detach(self)
            self._selector.close()

    def outcome_list(self) -> list[RankOutcome]:
        return [self.outcomes[rank] for rank in self.ranks]

    def running(self) -> list[int]:
        return [rank for rank, outcome in self.outcomes.items() if outcome.status is Status.RUNNING]

    def _spin(self) -> None:
        while not self.policy.done(self):
            ready = self._selector.select(self._wait_time())
            for key, _ in sorted(ready, key=lambda event: event[0].data[0]):
                if key.fd in self._selector.get_map():  # an earlier handler may have dropped it
                    key.data[1]()
            now = time.monotonic()
            self._escalation.fire(now)
            self._check_deadline(now)
            self._check_stall(now)
            self._sample(now)
            due = self.sink.tick_in()
            if due is not None and due <= 0:
                self.sink.tick()
            self.policy.on_clock(self, now)
            if self._desk is not None:
                self._desk.on_clock(now)

    def _wait_time(self) -> float | None:
        moments = [when for when in (self._escalation.next_at(),) if when is not None]
        held = self._held_since is not None
        desk_due = self._desk.wake_at() if self._desk is not None else None
        sample_due = self.sampler.due() if self.sampler is not None else None
        for moment in (
            self.deadline if not (self.timed_out or held) else None,
            self.policy.wake_at(),
            None if held else self._stall_due(),
            desk_due,
            sample_due,
        ):
            if moment is not None:
                moments.append(moment)
        now = time.monotonic()
        sink_due = self.sink.tick_in()
        if sink_due is not None:
            moments.append(now + sink_due)
        poll = self.group.poll()
        if poll is not None:
            moments.append(now + poll)
        return max(0.0, min(moments) - now) if moments else None

    def _check_deadline(self, now: float) -> None:
        if self.deadline is None or self.timed_out or now < self.deadline or self._held_since is not None:
            return
        self.timed_out = True
        self.running_at_timeout = {rank: last_line(self.group.last_lines(rank)) for rank in self.running()}
        self.policy.on_timeout(self)

    def _sample(self, now: float) -> None:
        if self.sampler is None or now < self.sampler.due():
            return
        for rank, sample in self.sampler.sample(now, self.running()).items():
            self.sink.event(rank, rich.resources_event(sample))

    def _stall_due(self) -> float | None:
        if self.stall_report is None or self._stall_shown:
            return None
        return self._last_activity + self.stall_report

    def _check_stall(self, now: float) -> None:
        due = self._stall_due()
        if due is None or now < due or not self.running() or self._held_since is not None:
            return
        self._stall_shown = True  # once per quiet spell: output re-arms it
        self.collect_stacks(self.running(), f"no output for {self.stall_report:g} s")

    # -- what a group's sources call -------------------------------------------------------------

    def add_reader(self, fd: int, handler: Callable[[], None], order: Order) -> None:
        """Wake up for ``fd``; when several are ready, lower ``order`` first."""
        self._selector.register(fd, selectors.EVENT_READ, (order, handler))

    def remove_reader(self, fd: int) -> None:
        if fd in self._selector.get_map():
            self._selector.unregister(fd)

    def lines(self, rank: int, stream: str, lines: list[str]) -> None:
        """Whole lines ``rank`` wrote to ``stream``."""
        self._active()
        self.sink.output(rank, stream, lines)

    def event(self, rank: int, event: Event) -> None:
        """One event from ``rank``'s stream (``nbaccel.wire.events``)."""
        kind = event.kind
        if kind is Kind.RICH:
            self._active()
            self.sink.event(rank, event.value())
        elif kind is Kind.IMPORTED:
            warm.note(event.value())
        elif kind in DEBUG_KINDS:
            if self._desk is None:
                self._desk = DebugDesk(self)
            self._desk.on_event(rank, kind, event.value())
        elif kind is Kind.READY:
            self.policy.on_ready(self, rank, event.value())
        elif kind is Kind.RESULT or kind is Kind.ERROR:
            outcome = self.outcomes.get(rank)
            if outcome is not None:  # a rank not taking part has nothing to answer
                record_answer(outcome, event, self.stop_reason, self.group.last_lines(rank))
                self.policy.on_answer(self, outcome, raised=kind is Kind.ERROR)

    def exited(self, rank: int, returncode: int) -> None:
        """``rank``'s process ended with ``returncode`` (negative: that signal); output drained."""
        self.ended.add(rank)
        if self._desk is not None:
            self._desk.rank_ended(rank)
        outcome = self.outcomes.get(rank) or RankOutcome(rank)
        self._memory_at_exit(outcome, killed=returncode == -signal.SIGKILL and not self.group.was_signalled(rank))
        record_exit(outcome, returncode, self.stop_reason, self.group.was_signalled(rank), self.group.last_lines(rank))
        self.policy.on_exit(self, outcome)

    def _memory_at_exit(self, outcome: RankOutcome, killed: bool) -> None:
        """The rank's peak, and for a SIGKILL nbaccel did not send whether it was the OOM killer:
        decided here from this node's sampler, or by the rank's node agent (the same code, there)."""
        if self.sampler is not None:
            outcome.peak_rss = self.sampler.peaks.get(outcome.rank)
            outcome.out_of_memory = self.sampler.out_of_memory(outcome.rank) if killed else None
            return
        remote = getattr(self.group, "memory_at_exit", None)  # a group across nodes: its agents' word
        if callable(remote):
            outcome.peak_rss, words = remote(outcome.rank)
            outcome.out_of_memory = words if killed else None

    def hold_clocks(self) -> None:
        """A rank is in the debugger: ``timeout=`` and the stall report wait (idempotent)."""
        if self._held_since is None:
            self._held_since = time.monotonic()

    def release_clocks(self) -> None:
        """No rank is in the debugger any more: the clocks go on, less the time they stood still."""
        if self._held_since is None:
            return
        held, self._held_since = time.monotonic() - self._held_since, None
        if self.deadline is not None:
            self.deadline += held
        self._last_activity += held

    def _active(self) -> None:
        self._last_activity = time.monotonic()
        self._stall_shown = False

    # -- what policies call ----------------------------------------------------------------------

    def collect_stacks(self, ranks: Iterable[int], why: str) -> None:
        """Ask ``ranks`` where they are; show it in each rank's view and keep it in its outcome."""
        for rank, stack in sorted(self.group.stacks(ranks).items()):
            outcome = self.outcomes.get(rank)
            if outcome is not None:
                outcome.where, outcome.stack = stack.summary, stack.text
            self.sink.event(rank, rich.stack_event(stack.summary, stack.text, why))

    def finish(self, outcome: RankOutcome) -> None:
        """Tell the sink that ``outcome.rank`` is done with this launch or task."""
        self.sink.rank_finished(outcome)

    def begin_stop(self, reason: Status) -> bool:
        """Record why ranks are being stopped; False when a stop already under way takes precedence
        (any stop over a later failure or timeout; an interrupt over anything)."""
        if self.stop_reason is Status.INTERRUPTED or (self.stop_reason is not None and reason is not Status.INTERRUPTED):
            return False
        self.stop_reason = reason
        return True

    def escalate(self, plan: StopPlan, ranks: Iterable[int] | None = None, keep: bool = False) -> None:
        """Send each (delay, signal) of ``plan`` in turn to ``ranks`` (default every rank);
        replaces any escalation under way unless ``keep``."""
        self._escalation.start(plan, range(self.group.num_processes) if ranks is None else ranks, keep=keep)


def sampler_for(group: RankGroup) -> ResourceSampler | None:
    """A sampler of the group's processes on this node (a group across nodes has none here), and of
    their GPUs where they run on CUDA."""
    local_pids = getattr(group, "local_pids", None)
    local_gpus = getattr(group, "local_gpus", None)
    if not callable(local_pids):
        return None
    vendor = str(getattr(group, "gpu_vendor", "") or "nvidia")
    return ResourceSampler(local_pids(), time.monotonic(), gpus=local_gpus() if callable(local_gpus) else None, vendor=vendor)


class SinkSession:
    """The one sink lifecycle: ``launch_started`` on entry, ``launch_finished`` on exit however it ends.

    Example::

        with SinkSession(sink, plan.num_processes, attempt) as session:
            loop = session.watch(EventLoop(group, sink, OneShot()))
            loop.run()
    """

    def __init__(self, sink: Sink, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        self.sink = sink
        self._announce = (num_processes, attempt, None if ranks is None else list(ranks))
        self._loop: EventLoop | None = None

    def __enter__(self) -> Self:
        num_processes, attempt, ranks = self._announce
        self.sink.launch_started(num_processes, attempt, ranks=ranks)
        return self

    def watch(self, loop: EventLoop) -> EventLoop:
        """The loop whose outcomes ``launch_finished`` reports."""
        self._loop = loop
        return loop

    def __exit__(self, *exc: object) -> None:
        self.sink.launch_finished(self._loop.outcome_list() if self._loop is not None else [])
