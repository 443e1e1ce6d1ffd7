"""The text view's closing lines give each rank's figures, as the widget view's last chips do:
peak memory, CPU time and, on a GPU, peak device memory.

Imports internals (output.text, launch.outcome): it tests those units directly, below the public face.
"""

from __future__ import annotations

import io
import re
import time

import pytest

from nbaccel import notebook_launcher
from nbaccel.launch.outcome import RankOutcome, Status
from nbaccel.output.text import RichTextSink


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


def work(seconds: float) -> int:
    """Rank 0 computes for ``seconds``; rank 1 holds 300 MiB and sleeps as long."""
    import os

    if os.environ["RANK"] == "1":
        held = b"\x01" * (300 * 2**20)  # every page written: resident
        time.sleep(seconds)
        return len(held)
    deadline = time.process_time() + seconds
    while time.process_time() < deadline:  # CPU time, whatever the machine's load
        pass
    return 0


def _figures(line: str) -> tuple[float, float]:
    """(peak MiB, cpu s) of ``nbaccel: rank N: peak 1.2 GiB · cpu 2.3 s``."""
    match = re.fullmatch(r"nbaccel: rank \d: peak ([\d.]+) (MiB|GiB) · cpu ([\d.]+) s", line)
    assert match, line
    peak = float(match.group(1)) * (1024 if match.group(2) == "GiB" else 1)
    return peak, float(match.group(3))


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_real_launch_in_text_mode_ends_with_each_ranks_peak_and_cpu_time(capsys: pytest.CaptureFixture[str]) -> None:
    """Sampled once a second by the kernel: ranks that run 2.5 s have two samples or more."""
    assert notebook_launcher(work, (2.5,), num_processes=2, cpu=True, output="text") == [0, 300 * 2**20]
    closing = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel: rank ")]
    assert [line.split(":")[1] for line in closing] == [" rank 0", " rank 1"]
    (peak0, cpu0), (peak1, cpu1) = (_figures(line) for line in closing)
    assert cpu0 >= 0.9 and cpu1 < 0.5 * cpu0  # the busy rank's CPU time, at its last sample (a second or more before its end)
    assert peak1 - peak0 >= 250  # MiB: the 300 MiB rank 1 held


def sleep_then_hold(seconds: float) -> None:
    """A worker task: long enough to be sampled once or more (about once a second)."""
    time.sleep(seconds)


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_a_pools_cells_end_with_figures_and_its_housekeeping_without(capsys: pytest.CaptureFixture[str]) -> None:
    """A cell on the workers is a launch to the person watching; a push, a pull or a status is not."""
    from nbaccel import start_workers

    with start_workers(2, cpu=True) as pool:
        capsys.readouterr()
        pool.run(sleep_then_hold, 1.6, output="text")
        cell = [line for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel: rank ")]
        pool.push(x=1)
        pool.status()
        pool.pull("x")
        housekeeping = capsys.readouterr().out
    assert [line.split(":")[1] for line in cell] == [" rank 0", " rank 1"], cell
    assert "nbaccel: rank" not in housekeeping, housekeeping
