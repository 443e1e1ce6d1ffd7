"""Where is each rank? Stacks dumped by the ranks themselves when a launch is interrupted, times out,
is stopped by a peer's failure or stalls, and on demand from persistent workers.

Imports internals (launch.stacks): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

import nbaccel
from nbaccel.launch.stacks import summarise, without_launch_frames
from nbaccel.testing import CollectingSink
from tests.handshake import MarkWhen, mark, wait_until_blocked

pytestmark = pytest.mark.timeout(60)

HERE = os.path.basename(__file__)

# -- the summary line, from dumps as faulthandler writes them ------------------------------------

LIBRARY = "/usr/lib/python3/site-packages"
DUMP = f'''Thread 0x00007f0000000002 (most recent call first):
  File "{LIBRARY}/torch/utils/data/_utils/pin_memory.py", line 50 in _pin_memory_loop

Current thread 0x00007f0000000001 (most recent call first):
  File "{LIBRARY}/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "{LIBRARY}/torch/distributed/c10d_logger.py", line 83 in wrapper
  File "/home/me/train.py", line 12 in step
  File "{LIBRARY}/nbaccel/rank/bootstrap.py", line 134 in execute
  File "{LIBRARY}/nbaccel/launch/starters/fork.py", line 29 in start
  File "/home/me/notebook.py", line 3 in <module>
'''


def test_the_summary_names_the_users_innermost_line_and_the_call_it_is_in() -> None:
    assert summarise(1, DUMP) == "rank 1: in `wrapper` at /home/me/train.py, line 12"


def test_the_kernels_stack_below_the_bootstrap_is_not_shown() -> None:
    shown = without_launch_frames(DUMP)
    assert "train.py" in shown and "pin_memory" in shown
    assert "fork.py" not in shown and "notebook.py" not in shown


def test_a_rank_inside_library_code_only_names_the_innermost_call() -> None:
    dump = f'Current thread 0x1 (most recent call first):\n  File "{LIBRARY}/torch/x.py", line 5 in barrier\n'
    assert summarise(0, dump) == f"rank 0: in `barrier` ({LIBRARY}/torch/x.py, line 5)"


def test_an_empty_dump_says_so() -> None:
    assert "no Python stack" in summarise(3, "")


# -- real ranks ----------------------------------------------------------------------------------


def all_reduce_while_rank_one_sleeps() -> None:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    print("ready", flush=True)
    if state.process_index == 1:
        time.sleep(30)
    dist.all_reduce(torch.ones(1))


@pytest.mark.slow
def test_a_timeout_says_where_each_rank_was() -> None:
    sink = CollectingSink()
    with pytest.raises(nbaccel.LaunchTimeoutError) as caught:
        nbaccel.notebook_launcher(all_reduce_while_rank_one_sleeps, num_processes=2, timeout=8, output=sink)
    text = str(caught.value)
    assert f"rank 0: in `dist.all_reduce` at {__file__}" in text
    assert f"rank 1: in `time.sleep` at {__file__}" in text
    stacks = [e for e in sink.events.get(1, []) if e["type"] == "stack"]
    assert len(stacks) == 1 and stacks[0]["why"] == "stopped at the timeout"
    assert "in all_reduce_while_rank_one_sleeps" in stacks[0]["text"]
    assert psutil.Process().children() == []


class InterruptWhenStalled(CollectingSink):
    """Interrupts the launching thread (as the notebook's stop button does) once every rank was
    reported stalled, so each is surely inside its sleep or collective."""

    def event(self, rank: int, event: dict) -> None:
        super().event(rank, event)
        stalled = {r for r, seen in self.events.items() if any(e["type"] == "stack" for e in seen)}
        if stalled == {0, 1} and not getattr(self, "sent", False):
            self.sent = True
            os.kill(os.getpid(), signal.SIGINT)


def test_an_interrupt_says_where_each_rank_was() -> None:
    with pytest.raises(KeyboardInterrupt) as caught:
        nbaccel.notebook_launcher(all_reduce_while_rank_one_sleeps, num_processes=2, stall_report=0.3, output=InterruptWhenStalled())
    assert "where each rank was:" in str(caught.value)
    assert "rank 0: in `dist.all_reduce`" in str(caught.value)
    assert "rank 1: in `time.sleep`" in str(caught.value)
    assert psutil.Process().children() == []


def fail_on_rank_one_while_rank_zero_computes(started: str) -> None:
    if os.environ["RANK"] == "1":
        # Raise only once rank 0 is in its step: under load it may still be starting otherwise.
        deadline = time.monotonic() + 30
        while not os.path.exists(started) and time.monotonic() < deadline:
            time.sleep(0.01)
        raise ValueError("boom")
    open(started, "w").close()
    time.sleep(30)  # a stand-in for a long step that a peer's failure does not interrupt


def test_a_peer_stopped_by_a_failure_says_where_it_was(tmp_path) -> None:
    started = str(tmp_path / "rank-0-started")
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: boom") as caught:
        nbaccel.notebook_launcher(fail_on_rank_one_while_rank_zero_computes, args=(started,), num_processes=2)
    assert "Where the other ranks were when they were stopped:\n  rank 0: in `time.sleep`" in str(caught.value)


def quiet_until_reported(reported: str) -> int:
    """Quiet until the kernel's sink got both ranks' stall reports, then quiet twice as long again
    as the stall report's delay (that spell is the behaviour: a quiet rank is reported once)."""
    while not os.path.exists(reported):
        time.sleep(0.01)
    time.sleep(1.0)
    return int(os.environ["RANK"])


def _both_reported(sink: CollectingSink) -> bool:
    return all(any(e["type"] == "stack" for e in sink.events.get(rank, [])) for rank in (0, 1))


def test_a_stall_shows_each_ranks_stack_once_and_stops_nothing(tmp_path) -> None:
    reported = str(tmp_path / "reported")
    sink = MarkWhen(reported, _both_reported)
    assert nbaccel.notebook_launcher(quiet_until_reported, (reported,), num_processes=2, stall_report=0.5, output=sink) == [0, 1]
    for rank in (0, 1):
        stacks = [e for e in sink.events.get(rank, []) if e["type"] == "stack"]
        assert [e["why"] for e in stacks] == ["no output for 0.5 s"]
        summary = stacks[0]["summary"]  # in its quiet loop: asleep, or (rarely) looking for the marker
        assert summary.startswith((f"rank {rank}: in `time.sleep` at {__file__}, line ", f"rank {rank}: in `os.path.exists` at {__file__}, line ")), summary


def test_stall_report_is_checked() -> None:
    with pytest.raises(ValueError, match="stall_report must be a positive number of seconds or None"):
        nbaccel.notebook_launcher(quiet_until_reported, ("unused",), num_processes=2, stall_report=0)


def test_idle_workers_say_they_wait_for_a_cell() -> None:
    idle = ["rank 0: idle, waiting for the next cell", "rank 1: idle, waiting for the next cell"]
    with nbaccel.start_workers(2) as pool:
        deadline = time.monotonic() + 10  # a rank may still be finishing its READY write
        while (summaries := [s.summary for s in pool.stacks()]) != idle:
            assert time.monotonic() < deadline, summaries
            assert all(s.startswith(f"rank {r}: ") for r, s in enumerate(summaries))


def raise_on_rank_one_while_rank_zero_waits_in_all_reduce(marker: str) -> None:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    dist.barrier()  # both ranks are in the group
    if state.process_index == 1:
        wait_until_blocked(marker)  # rank 0 has reached all_reduce, where it blocks
        raise ValueError("boom")
    mark(marker)
    dist.all_reduce(torch.ones(1))


@pytest.mark.parametrize("attempt", range(4))
def test_a_peer_blocked_in_a_collective_is_always_reported_where_it_was(attempt: int, tmp_path) -> None:
    """The failing rank is held at its error until its peers' stacks are taken, so rank 0 does not
    die first of rank 1's closed connection (which left only "rank 0: stopped")."""
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: boom") as caught:
        nbaccel.notebook_launcher(raise_on_rank_one_while_rank_zero_waits_in_all_reduce, (str(tmp_path / "in-all-reduce"),), num_processes=2)
    assert f"Where the other ranks were when they were stopped:\n  rank 0: in `dist.all_reduce` at {__file__}" in str(caught.value)
    assert psutil.Process().children() == []


def test_a_rank_at_its_debugger_prompt_is_said_to_be_there() -> None:
    dump = (
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{LIBRARY}/nbaccel/wire/events.py", line 190 in _read_exactly\n'
        f'  File "{LIBRARY}/nbaccel/rank/debugger.py", line 60 in ask\n'
        '  File "/usr/lib/python3.11/cmd.py", line 126 in cmdloop\n'
        '  File "/usr/lib/python3.11/bdb.py", line 90 in dispatch_line\n'
        '  File "/home/me/train.py", line 7 in step\n'
        f'  File "{LIBRARY}/nbaccel/rank/bootstrap.py", line 134 in execute\n'
    )
    assert summarise(1, dump) == "rank 1: at its debugger prompt, at /home/me/train.py, line 7 (in step)"
    post_mortem = dump.replace('  File "/home/me/train.py", line 7 in step\n', "")
    assert summarise(1, post_mortem) == "rank 1: at its debugger prompt (post-mortem)"
