"""The loop samples each rank's CPU and memory once a second: events to the sink, peaks in outcomes, no thread.

Imports internals (launch.sampler): one test drives the sampler itself on a process that is a zombie.
"""

from __future__ import annotations

import threading

import pytest

import nbaccel
from nbaccel.testing import CollectingSink

pytestmark = pytest.mark.timeout(60)


def hold_memory_and_spin(seconds: float = 2.5) -> int:
    import os
    import time

    held = bytearray(b"x" * ((100 + 100 * int(os.environ["RANK"])) * 2**20))  # rank 1 holds 100 MiB more
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return len(held)


@pytest.mark.slow
def test_every_rank_is_sampled_about_once_a_second_and_its_peak_lands_in_its_outcome() -> None:
    threads = set(threading.enumerate())
    sink = CollectingSink()
    nbaccel.notebook_launcher(hold_memory_and_spin, num_processes=2, output=sink)
    samples = {rank: [e for e in events if e["type"] == "resources"] for rank, events in sink.events.items()}
    for rank in (0, 1):
        assert 1 <= len(samples[rank]) <= 4, samples[rank]
        last = samples[rank][-1]
        assert last["rss"] >= (100 + 100 * rank) * 2**20 and last["peak_rss"] >= last["rss"]
        assert 0 <= last["cpu"] <= 200
    assert max(s["cpu"] for s in samples[1]) > 5  # it spins: the sampler sees its CPU time (a share of two busy cores)
    peaks = {o.rank: o.peak_rss for o in sink.finished}
    for rank in (0, 1):  # the outcome keeps the most it held: at least every sample, and what it allocated
        assert peaks[rank] is not None and peaks[rank] >= max(s["rss"] for s in samples[rank]) >= (100 + 100 * rank) * 2**20
    assert set(threading.enumerate()) == threads  # sampling runs on the loop's clock: no thread


def test_a_rank_that_exited_and_is_not_yet_reaped_is_not_sampled_as_zero_bytes() -> None:
    import os
    from pathlib import Path

    from nbaccel.launch.sampler import ResourceSampler

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        sampler = ResourceSampler({0: pid}, now=0.0)
        while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
            pass  # until the child is a zombie: exited, not reaped
        assert sampler.sample(1.0) == {}
    finally:
        os.waitpid(pid, 0)
