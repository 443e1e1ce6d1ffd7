"""The one clock of a sink: the kernel's event loop asks ``tick_in()`` and calls ``tick()``, in a real launch.

A rank prints one line and then stays quiet until a marker file exists; only a tick of the sink
that comes after that line, while no output arrives, writes the marker. So the launch returns
True only if the loop woke up for the sink alone (no thread, no later line to ride on).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import nbaccel
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(90)


class TickedSink(CollectingSink):
    """Wants a tick ``delay`` seconds after each line; that tick writes ``marker``."""

    def __init__(self, marker: Path, delay: float = 0.05) -> None:
        super().__init__()
        self.marker = marker
        self.delay = delay
        self.due_at: float | None = None
        self.ticks = 0

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        super().output(rank, stream, lines)
        self.due_at = time.monotonic() + self.delay

    def tick_in(self) -> float | None:
        return None if self.due_at is None else max(0.0, self.due_at - time.monotonic())

    def tick(self) -> None:
        self.ticks += 1
        if self.due_at is not None and time.monotonic() >= self.due_at:
            self.due_at = None
            self.marker.write_text("ticked after: " + " | ".join(self.text(0)))


def quiet_after_one_line(marker: str) -> str:
    print("before the quiet spell", flush=True)
    deadline = time.monotonic() + 30.0  # a bound for a broken build, not a wait: the marker ends it
    while not os.path.exists(marker) and time.monotonic() < deadline:
        time.sleep(0.005)
    return open(marker).read() if os.path.exists(marker) else "no tick came"


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_the_event_loop_ticks_a_sink_while_the_ranks_are_quiet(tmp_path: Path, start_method: str) -> None:
    marker = tmp_path / "ticked"
    sink = TickedSink(marker)
    answers = nbaccel.notebook_launcher(quiet_after_one_line, (str(marker),), num_processes=1, start_method=start_method, output=sink, cpu=True)
    assert answers == ["ticked after: before the quiet spell"]
    assert sink.ticks >= 1 and sink.tick_in() is None  # once it has ticked, it wants no more
