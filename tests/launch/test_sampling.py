"""The loop samples each rank's CPU and memory once a second: events to the sink, peaks in outcomes, no thread.

Imports internals (launch.sampler): two tests drive the sampler itself, on a zombie and on a process the OOM killer ends.
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


def test_a_rank_sampled_while_the_oom_killer_ends_it_keeps_its_cgroup(memory_cgroup) -> None:
    """Under cgroup v1 an exiting process already shows the root cgroup: a sample then must not
    replace the rank's own, or its OOM kill reads as a plain SIGKILL (a loaded CI run saw it)."""
    import os

    from nbaccel.launch.sampler import ResourceSampler

    pid = os.fork()
    if pid == 0:  # grows until the OOM killer takes it
        try:
            (memory_cgroup / "cgroup.procs").write_text(str(os.getpid()))
            chunks = []
            while True:
                chunks.append(bytearray(b"x" * (10 * 2**20)))
        finally:
            os._exit(1)
    sampler = ResourceSampler({0: pid}, now=0.0)
    now = 0.0
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:  # through its whole exit
        now += 1.0
        sampler.sample(now)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == 9
    assert (sampler.out_of_memory(0) or "").startswith("killed by the out-of-memory killer (peak "), sampler._cgroups
