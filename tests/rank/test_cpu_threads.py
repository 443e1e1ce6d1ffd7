"""Each rank of a launch sizes torch's thread pool for its share of the cores.

Imports internals (launch.openmp, rank.cpu_threads): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from nbaccel import notebook_launcher
from nbaccel.launch.openmp import openmp_pool_started
from nbaccel.rank.cpu_threads import threads_per_rank

pytestmark = pytest.mark.timeout(90)


def test_cores_are_divided_among_the_ranks_of_a_machine() -> None:
    assert threads_per_rank(2, cores=16) == 8
    assert threads_per_rank(3, cores=16) == 5
    assert threads_per_rank(4, cores=2) == 1  # never zero threads
    assert threads_per_rank(1, cores=2) == 2


def pool_size() -> tuple[int, str]:
    import torch

    return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]


def test_a_forked_rank_does_not_keep_the_kernels_pool_of_every_core() -> None:
    import torch  # noqa: F401 - imported before the fork, as in a notebook

    # A kernel whose OpenMP pool started (an earlier test's torch op) forks one-thread ranks.
    expected = 1 if openmp_pool_started() else threads_per_rank(2)
    results = notebook_launcher(pool_size, num_processes=2, cpu=True, timeout=60, output="text")
    assert results == [(expected, str(expected))] * 2


USER_CHOICE = """
import torch
from nbaccel.launcher import notebook_launcher

def pool_size():
    import os, torch
    return torch.get_num_threads(), os.environ["OMP_NUM_THREADS"]

print(notebook_launcher(pool_size, num_processes=1, cpu=True, timeout=60, output="text"))
"""


@pytest.mark.slow
def test_omp_num_threads_set_by_the_user_is_kept() -> None:
    # One rank: nbaccel's share would be every core; the user asked for one thread.
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(USER_CHOICE)], check=False, capture_output=True, text=True, timeout=80, env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().splitlines()[-1] == "[(1, '1')]"
