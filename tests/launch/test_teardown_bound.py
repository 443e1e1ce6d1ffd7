"""Teardown after success is bounded: a rank stuck in destroy_process_group is killed and the user told (issue 14, item 14).

Real ranks on gloo; rank 1's ``destroy_process_group`` blocks, as a stuck NCCL teardown would.

Imports nbaccel.launch.one_shot (internal): the test shortens its TEARDOWN_BOUND.
"""

from __future__ import annotations

import time

import psutil
import pytest

import nbaccel
import nbaccel.launch.one_shot as one_shot
from nbaccel.testing import scaled

pytestmark = pytest.mark.timeout(90)


def teardown_hangs_on_rank_one() -> int:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    value = torch.ones(1)
    dist.all_reduce(value)
    if state.process_index == 1:
        dist.destroy_process_group = lambda *args, **kwargs: time.sleep(600)  # what the launcher calls on the way out
    return state.process_index + int(value.item())


def test_a_rank_stuck_in_teardown_is_killed_after_the_bound_and_the_results_kept(monkeypatch, capsys) -> None:
    monkeypatch.setattr(one_shot, "TEARDOWN_BOUND", 1.0)
    started = time.monotonic()
    assert nbaccel.notebook_launcher(teardown_hangs_on_rank_one, num_processes=2, cpu=True, output="text") == [2, 3]
    assert time.monotonic() - started < scaled(15)
    out = capsys.readouterr().out
    assert "rank(s) 1 returned but did not leave the process group within 1 s (stuck in destroy_process_group)" in out
    assert psutil.Process().children() == []


def test_a_quick_teardown_says_nothing(capsys) -> None:
    def all_reduce() -> int:
        import torch
        import torch.distributed as dist

        nbaccel.PartialState()
        value = torch.ones(1)
        dist.all_reduce(value)
        return int(value.item())

    assert nbaccel.notebook_launcher(all_reduce, num_processes=2, cpu=True, output="text") == [2, 2]
    assert "did not leave" not in capsys.readouterr().out
