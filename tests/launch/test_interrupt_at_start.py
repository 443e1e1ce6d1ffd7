"""An interrupt that lands while the ranks are being started leaves no rank running, and ends the view.

Unfreezing the kernel's heap after the last fork takes a while (a large heap): a Ctrl-C lands
there often enough. Raised from ``gc.unfreeze`` here, so the moment is exact.

Imports internals (launch.outcome): it tests those units directly, below the public face.
"""

from __future__ import annotations

import gc

import pytest

import nbaccel
from nbaccel.launch.outcome import RankOutcome
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(60)


class LifecycleSink(CollectingSink):
    def __init__(self) -> None:
        super().__init__()
        self.ended: list[list[RankOutcome]] = []

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        self.ended.append(list(outcomes))


def sleeps() -> None:
    import time

    time.sleep(30)


def test_an_interrupt_just_after_the_forks_leaves_no_rank_and_finishes_the_sink(monkeypatch: pytest.MonkeyPatch) -> None:
    unfreeze = gc.unfreeze

    def interrupted_once() -> None:
        monkeypatch.setattr(gc, "unfreeze", unfreeze)
        unfreeze()
        raise KeyboardInterrupt

    monkeypatch.setattr(gc, "unfreeze", interrupted_once)
    sink = LifecycleSink()
    with pytest.raises(KeyboardInterrupt):
        nbaccel.notebook_launcher(sleeps, num_processes=2, output=sink)
    assert len(sink.ended) == 1  # and the autouse leak check finds no rank left running
