"""The text view's closing lines give each rank's figures, as the widget view's last chips do:
peak memory, CPU time and, on a GPU, peak device memory.

Imports internals (output.text, launch.outcome): it tests those units directly, below the public face.
"""

from __future__ import annotations

import io
import re
import time
from pathlib import Path

import pytest

from nbaccel import notebook_launcher
from nbaccel.launch.outcome import RankOutcome, Status
from nbaccel.output.choose import text_sink
from nbaccel.output.sinks import TeeSink
from nbaccel.output.text import RichTextSink
from nbaccel.testing import CollectingSink
from tests.handshake import MarkWhen, wait_for


def test_each_sampled_rank_gets_one_closing_line_with_its_peaks_and_its_latest_cpu_time() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out)
    sink.launch_started(3, attempt=0)
    sink.event(0, {"type": "resources", "cpu": 99.0, "rss": 2**30, "peak_rss": 2**30, "cpu_time": 0.9})
    sink.event(0, {"type": "resources", "cpu": 99.0, "rss": 2**29, "peak_rss": 3 * 2**29, "cpu_time": 1.9})
    sink.event(
        1, {"type": "resources", "cpu": 5.0, "rss": 2**28, "peak_rss": 2**28, "cpu_time": 0.1, "gpu_mem": 2**30, "peak_gpu_mem": 5 * 2**30, "gpu_util": 90}
    )
    sink.event(1, {"type": "resources", "cpu": 5.0, "rss": 2**28, "peak_rss": 2**28, "gpu_mem": 2**30, "peak_gpu_mem": 2**30})  # an older agent: no cpu_time
    for rank in range(3):
        sink.rank_finished(RankOutcome(rank, Status.SUCCEEDED, exitcode=0))
    sink.launch_finished([RankOutcome(rank, Status.SUCCEEDED) for rank in range(3)])
    assert out.getvalue().splitlines() == [
        "nbaccel: rank 0: peak 1.5 GiB · cpu 1.9 s",
        "nbaccel: rank 1: peak 256 MiB · cpu 0.1 s · gpu peak 5.0 GiB",
    ]  # rank 2 ended before its first sample: no figures, no line


def test_a_peak_the_loop_kept_in_the_outcome_counts_and_the_next_launch_starts_afresh() -> None:
    out = io.StringIO()
    sink = RichTextSink(stdout=out)
    sink.launch_started(1, attempt=0)
    sink.event(0, {"type": "resources", "cpu": 50.0, "rss": 2**28, "peak_rss": 2**28, "cpu_time": 12.0})
    sink.rank_finished(RankOutcome(0, Status.SUCCEEDED, exitcode=0, peak_rss=2**29))  # read once more at its exit
    sink.launch_finished([])
    sink.launch_started(1, attempt=1)
    sink.launch_finished([])
    assert out.getvalue().splitlines() == ["nbaccel: rank 0: peak 512 MiB · cpu 12 s"]


def work(sampled: str) -> int:
    """Rank 0 computes, rank 1 holds 300 MiB, until the kernel's sink saw both in a sample (``sampled``)."""
    import os

    if os.environ["RANK"] == "1":
        held = b"\x01" * (300 * 2**20)  # every page written: resident
        wait_for(sampled)
        return len(held)
    deadline = time.monotonic() + 30  # a bound for a broken build, not a wait: the marker ends it
    while not os.path.exists(sampled) and time.monotonic() < deadline:
        for _ in range(10**5):  # CPU time, whatever the machine's load
            pass
    return 0


def _both_sampled(sink: CollectingSink) -> bool:
    """A sample of rank 0 after a second of CPU time, and one of rank 1 holding its 300 MiB."""
    samples = {rank: [e for e in sink.events.get(rank, []) if e.get("type") == "resources"] for rank in (0, 1)}
    return any((e.get("cpu_time") or 0) >= 1.0 for e in samples[0]) and any((e.get("peak_rss") or 0) >= 300 * 2**20 for e in samples[1])


def _figures(line: str) -> tuple[float, float]:
    """(peak MiB, cpu s) of ``nbaccel: rank N: peak 1.2 GiB · cpu 2.3 s``."""
    match = re.fullmatch(r"nbaccel: rank \d: peak ([\d.]+) (MiB|GiB) · cpu ([\d.]+) s", line)
    assert match, line
    peak = float(match.group(1)) * (1024 if match.group(2) == "GiB" else 1)
    return peak, float(match.group(3))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_real_launch_in_text_mode_ends_with_each_ranks_peak_and_cpu_time(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Sampled once a second by the kernel: the ranks run until the samples the figures need came."""
    sampled = str(tmp_path / "sampled")
    text = text_sink()  # what output="text" makes, beside a sink that tells the ranks what the kernel saw
    assert notebook_launcher(work, (sampled,), num_processes=2, cpu=True, output=TeeSink(text, MarkWhen(sampled, _both_sampled))) == [0, 300 * 2**20]
    closing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel: rank ")]
    assert [line.split(":")[1] for line in closing] == [" rank 0", " rank 1"]
    (peak0, cpu0), (peak1, cpu1) = (_figures(line) for line in closing)
    assert cpu0 >= 0.9 and cpu1 < 0.5 * cpu0  # the busy rank's CPU time, at its last sample (a second or more of it)
    assert peak1 - peak0 >= 250  # MiB: the 300 MiB rank 1 held


def until_sampled(sampled: str) -> None:
    """A worker task that ends once the kernel's sink saw a sample of every rank (about once a second)."""
    wait_for(sampled)


def _every_rank_sampled(sink: CollectingSink) -> bool:
    return all(any(e.get("type") == "resources" for e in sink.events.get(rank, [])) for rank in (0, 1))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_pools_cells_end_with_figures_and_its_housekeeping_without(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """A cell on the workers is a launch to the person watching; a push, a pull or a status is not."""
    from nbaccel import start_workers

    with start_workers(2, cpu=True) as pool:
        capsys.readouterr()
        sampled = str(tmp_path / "sampled")
        pool.run(until_sampled, sampled, output=TeeSink(text_sink(), MarkWhen(sampled, _every_rank_sampled)))  # output="text"'s sink, and a handshake
        cell = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel: rank ")]
        pool.push(x=1)
        pool.status()
        pool.pull("x")
        housekeeping = capsys.readouterr().out
    assert [line.split(":")[1] for line in cell] == [" rank 0", " rank 1"], cell
    assert "nbaccel: rank" not in housekeeping, housekeeping
