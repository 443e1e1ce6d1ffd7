"""Out of memory, named: a rank past RLIMIT_AS, a rank the OOM killer takes in a memory cgroup."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import nbaccel
from nbaccel.testing import CollectingSink
from tests.handshake import MarkWhen, grow_until_sampled, sampled_above

pytestmark = pytest.mark.timeout(120)


def allocate_past_an_address_space_limit() -> None:
    import resource

    if os.environ["RANK"] == "1":
        with open("/proc/self/statm") as statm:
            virtual = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (virtual + 256 * 2**20, resource.RLIM_INFINITY))
        bytearray(2**30)


def test_a_rank_allocating_past_rlimit_as_is_reported_out_of_memory_with_its_peak() -> None:
    with pytest.raises(nbaccel.RankFailedError) as caught:
        nbaccel.notebook_launcher(allocate_past_an_address_space_limit, num_processes=2, output=CollectingSink())
    text = str(caught.value)
    assert "rank 1" in text and "MemoryError" in text, text
    assert "out of memory on rank 1: peak " in text and "(RLIMIT_AS)" in text, text


def grow_until_killed(cgroup: str, asked: str, seen: str) -> None:
    if os.environ["RANK"] == "1":
        with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
        # A real rank is in its cgroup from its start; this one moved itself, so it waits for the
        # kernel's sampler to see it there before growing to the limit: growing at once raced
        # that sample (a CI run lost the race on an agent); a sleep only made it rarer.
        chunks = [grow_until_sampled(asked, seen)]
        while True:  # 20 MiB every 100 ms, each page touched: the limit comes after about 1.5 s
            chunks.append(bytearray(b"x" * (20 * 2**20)))
            time.sleep(0.1)


@pytest.mark.slow
def test_a_rank_the_oom_killer_takes_is_named_with_its_peak_and_the_limit(memory_cgroup: Path, tmp_path: Path) -> None:
    asked, seen = str(tmp_path / "asked"), str(tmp_path / "seen")
    sink = MarkWhen(seen, sampled_above(1, asked))
    with pytest.raises(nbaccel.RankFailedError) as caught:
        nbaccel.notebook_launcher(grow_until_killed, args=(str(memory_cgroup), asked, seen), num_processes=2, output=sink)
    text = str(caught.value)
    assert "rank 1" in text and "killed by the out-of-memory killer (peak " in text and " of 300 MiB)" in text, text
    outcome = {o.rank: o for o in caught.value.outcomes}[1]
    assert outcome.peak_rss is not None and outcome.peak_rss > 100 * 2**20
