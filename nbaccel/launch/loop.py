"""The kernel's event loop over a group of ranks: their pipes, their exits, and timed signals.

One loop, in the thread that launched (the cell's), waits on every rank's pipes and pidfd at once:
no polling sleeps, no threads. Rank 0's events are handled first whenever several are ready.
What the loop is for (a one-shot launch, one cell on persistent workers) is a policy given by a
subclass: how frames are handled, what a rank's exit means, and when the loop is done.

Example::

    class UntilAllExit(RankWatch):
        def done(self) -> bool:
            return all(p.returncode is not None for p in self.processes)
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable, Sequence

from nbaccel.wire import frames as channel
from nbaccel.launch import warm
from nbaccel.launch.pipes import RankPipes
from nbaccel.output.sinks import Sink
from nbaccel.launch.processes import RankProcess

_NO_PIDFD_POLL = 0.02  # only where the OS has no pidfd: how often exits are looked for

Handler = Callable[[int], None]


class RankWatch:
    """Relays output and frames of ``processes`` to ``sink`` until ``done()``; schedules signals."""

    def __init__(self, processes: list[RankProcess], pipes: list[RankPipes], sink: Sink) -> None:
        self.processes = processes
        self.pipes = pipes
        self.sink = sink
        self._signals: list[tuple[float, int, list[RankProcess]]] = []  # (when, signal, to whom)
        self._selector = selectors.DefaultSelector()
        self._registered = False

    # -- policy: subclasses override ---------------------------------------------------------

    def done(self) -> bool:
        raise NotImplementedError

    def on_frame(self, rank: int, kind: channel.Kind, payload: bytes) -> None:
        if kind is channel.Kind.EVENT:
            self.sink.event(rank, channel.loads(payload))
        elif kind is channel.Kind.IMPORTED:
            warm.note(channel.loads(payload))

    def on_exit(self, rank: int) -> None:
        """``rank`` was reaped and its pipes drained."""

    def next_deadline(self) -> float | None:
        """The policy's next time.monotonic() moment to be woken at (a timeout), if any."""
        return None

    def on_clock(self, now: float) -> None:
        """Called after every wake-up, to act on deadlines."""

    # -- the loop --------------------------------------------------------------------------------

    def loop(self) -> None:
        """Run until ``done()``. The selector is opened on first use and kept until ``close()``."""
        if not self._registered:
            self._register()
            self._registered = True
        while not self.done():
            events = self._selector.select(self._wait_time())
            for key, _ in sorted(events, key=lambda e: e[0].data[0]):
                if key.fd in self._selector.get_map():  # an earlier handler may have dropped it
                    key.data[1](key.data[0][0])
            self._poll_exits_without_pidfd()
            now = time.monotonic()
            while self._signals and self._signals[0][0] <= now:
                _, sig, targets = self._signals.pop(0)
                self.signal(sig, targets)
            self._tick_sink()
            self.on_clock(now)

    def close(self) -> None:
        self._selector.close()

    def add_reader(self, fd: int, handler: Callable[[], None]) -> None:
        """Also wake up for ``fd`` (handled before any rank's events)."""
        self._selector.register(fd, selectors.EVENT_READ, ((-1, 0), lambda _rank: handler()))

    def remove_reader(self, fd: int) -> None:
        self._selector.unregister(fd)

    def _register(self) -> None:
        for proc, pipes in zip(self.processes, self.pipes):
            if proc.returncode is not None:
                continue
            handlers: list[tuple[int | None, int, Handler]] = [
                (pipes.channel, 0, self._on_channel),
                (pipes.stdout, 1, self._on_stdout),
                (pipes.stderr, 2, self._on_stderr),
                (proc.pidfd, 3, self._on_pidfd),
            ]
            for fd, order, handler in handlers:
                if fd is not None:
                    self._selector.register(fd, selectors.EVENT_READ, ((proc.rank, order), handler))

    def _wait_time(self) -> float | None:
        moments = [t for t, _, _ in self._signals[:1]]
        deadline = self.next_deadline()
        if deadline is not None:
            moments.append(deadline)
        sink_due = self._sink_tick_in()
        if sink_due is not None:
            moments.append(time.monotonic() + sink_due)
        wait = max(0.0, min(moments) - time.monotonic()) if moments else None
        if any(p.pidfd is None and p.returncode is None for p in self.processes):
            wait = _NO_PIDFD_POLL if wait is None else min(wait, _NO_PIDFD_POLL)
        return wait

    # -- the sink's clock: a live view pushes held lines and its elapsed time without a thread --

    def _sink_tick_in(self) -> float | None:
        tick_in = getattr(self.sink, "tick_in", None)
        return tick_in() if tick_in is not None else None

    def _tick_sink(self) -> None:
        due = self._sink_tick_in()
        if due is not None and due <= 0:
            self.sink.tick()  # type: ignore[attr-defined]

    # -- handlers --------------------------------------------------------------------------------

    def _on_stdout(self, rank: int) -> None:
        self._read_stream(rank, self.pipes[rank].stdout, "stdout")

    def _on_stderr(self, rank: int) -> None:
        self._read_stream(rank, self.pipes[rank].stderr, "stderr")

    def _read_stream(self, rank: int, fd: int, stream: str) -> None:
        if not self.pipes[rank].read_stream(fd, stream, self.sink):
            self._selector.unregister(fd)

    def _on_channel(self, rank: int) -> None:
        pipes = self.pipes[rank]
        frames, open_ = pipes.read_channel()
        if not open_:
            self._selector.unregister(pipes.channel)
        for kind, payload in frames:
            self.on_frame(rank, kind, payload)

    def _on_pidfd(self, rank: int) -> None:
        proc = self.processes[rank]
        if proc.poll() is None:
            return
        pipes = self.pipes[rank]
        for fd in (*pipes.fds, proc.pidfd):
            if fd is not None and fd in self._selector.get_map():
                self._selector.unregister(fd)
        for kind, payload in pipes.drain(self.sink):
            self.on_frame(rank, kind, payload)
        self.on_exit(rank)

    def _poll_exits_without_pidfd(self) -> None:
        for proc in self.processes:
            if proc.pidfd is None and proc.returncode is None and proc.poll() is not None:
                self._on_pidfd(proc.rank)

    # -- signals ---------------------------------------------------------------------------------

    def signal(self, sig: int, targets: list[RankProcess] | None = None) -> None:
        """Send ``sig`` now to the ranks in ``targets`` (default: all) that are still running."""
        for proc in self.processes if targets is None else targets:
            if proc.returncode is None:
                proc.send(sig)

    def escalate(self, plan: Sequence[tuple[float, int]], targets: list[RankProcess] | None = None, keep: bool = False) -> None:
        """Send each (delay, signal) of ``plan`` in turn to ``targets`` (default: every rank);
        replaces any escalation under way unless ``keep``."""
        start = time.monotonic()
        chosen = list(self.processes if targets is None else targets)
        if not keep:
            self._signals = []
        for delay, sig in plan:
            if delay <= 0:
                self.signal(sig, chosen)
            else:
                self._signals.append((start + delay, sig, chosen))
        self._signals.sort(key=lambda entry: entry[0])
