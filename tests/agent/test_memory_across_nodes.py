"""Out of memory, named on another node: the agent judges its rank's SIGKILL with the one-node code and says so.

A rank on node 1 moves itself into a memory cgroup (v1, limit 300 MiB, made by the test as root)
and grows until the kernel's OOM killer takes it; its agent's sampler saw it in that cgroup, so
the agent's word reaches the kernel and the failure reads as on one node. A rank that kills
itself with SIGKILL (no memory pressure) stays "killed by SIGKILL".

Imports nbaccel.launch.outcome (internal): the rank's status words, as its chip and tab say them.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from nbaccel import Cluster, NodeRankFailedError, notebook_launcher
from nbaccel.launch.outcome import status_words
from nbaccel.testing import CollectingSink
from tests.handshake import MarkWhen, grow_until_sampled, sampled_above, wait_for

pytestmark = pytest.mark.timeout(120)


def grow_on_rank_3_until_killed(cgroup: str, asked: str, seen: str) -> None:

    if os.environ["RANK"] != "3":
        time.sleep(30)  # stopped by nbaccel after rank 3's failure
        return
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
    # A real rank is in its cgroup from its start; this one moved itself, so it waits for the
    # agent's sampler to see it there (a sample that shows it grew after the move) before growing.
    chunks = [grow_until_sampled(asked, seen)]
    while True:  # 20 MiB every 100 ms, each page touched: the limit comes after about 1.5 s
        chunks.append(bytearray(b"x" * (20 * 2**20)))
        time.sleep(0.1)


def test_a_rank_the_oom_killer_takes_on_another_node_is_named_with_its_peak_and_the_limit(two_nodes: Cluster, memory_cgroup: Path, tmp_path: Path) -> None:
    asked, seen = str(tmp_path / "asked"), str(tmp_path / "seen")
    sink = MarkWhen(seen, sampled_above(3, asked))
    with pytest.raises(NodeRankFailedError) as caught:
        notebook_launcher(grow_on_rank_3_until_killed, args=(str(memory_cgroup), asked, seen), cluster=two_nodes, output=sink)
    text = str(caught.value)
    assert "rank 3 on node 1 (" in text and "killed by the out-of-memory killer (peak " in text and " of 300 MiB)" in text, text
    outcome = {o.rank: o for o in caught.value.outcomes}[3]
    assert outcome.peak_rss is not None and outcome.peak_rss > 100 * 2**20  # the agent's sample, sent with the exit
    assert status_words(outcome).short == "failed (out of memory)"  # the rank's chip and tab
    assert [o.status.value for o in sorted(caught.value.outcomes, key=lambda o: o.rank)] == ["stopped", "stopped", "stopped", "killed"]


def kill_rank_3_by_sigkill(seen: str) -> None:
    import signal

    if os.environ["RANK"] == "3":
        wait_for(seen)  # its agent sampled it once, holding little
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(30)


def _sampled(rank: int) -> Callable[[CollectingSink], bool]:
    return lambda sink: any(e.get("type") == "resources" for e in sink.events.get(rank, []))


def test_a_sigkill_without_memory_pressure_on_another_node_stays_a_sigkill(two_nodes: Cluster, tmp_path: Path) -> None:
    seen = str(tmp_path / "seen")
    with pytest.raises(NodeRankFailedError) as caught:
        notebook_launcher(kill_rank_3_by_sigkill, (seen,), cluster=two_nodes, output=MarkWhen(seen, _sampled(3)))
    text = str(caught.value)
    assert "rank 3 on node 1 (" in text and "killed by SIGKILL" in text and "out-of-memory" not in text, text
    outcome = {o.rank: o for o in caught.value.outcomes}[3]
    assert outcome.signal == signal.SIGKILL and outcome.out_of_memory is None
    assert outcome.peak_rss is not None and outcome.peak_rss > 0  # the agent sampled it
