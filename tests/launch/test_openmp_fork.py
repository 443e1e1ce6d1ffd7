"""The OpenMP hang (issue 14, item 16): a rank forked after the kernel used libgomp's pool.

Reproduced for real in a fresh interpreter (the kernel's part): a multi-threaded CPU op there,
then a one-rank launch whose function asks for two threads and sums a large tensor. Without the
guard the rank never returns from the sum (``LaunchTimeoutError``); with it the rank runs on one
thread, and both notices appear.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from nbaccel.testing import scaled

pytestmark = pytest.mark.timeout(180)

KERNEL = """
import json, os, torch, nbaccel
from nbaccel.launch.openmp import openmp_pool_started
torch.set_num_threads(2)  # more threads than ranks, on any machine
before = openmp_pool_started()
x = torch.ones(2**22); x.sum()  # the kernel's multi-threaded CPU op starts libgomp's pool
after = openmp_pool_started()

def rank_work():
    torch.set_num_threads(2)
    return float((torch.ones(2**22) * 2).sum()), torch.get_num_threads()

result = nbaccel.notebook_launcher(rank_work, num_processes=1, timeout=float(os.environ["LIMIT"]))
print(json.dumps({"before": before, "after": after, "result": result}))
"""


@pytest.mark.slow
def test_a_rank_forked_after_the_kernel_used_openmp_does_not_hang() -> None:
    env = {**os.environ, "LIMIT": str(scaled(60)), "NBACCEL_OUTPUT": "text"}
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(KERNEL)], env=env, capture_output=True, text=True, timeout=scaled(120), check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    seen = json.loads(lines[-1])
    assert seen["before"] is False and seen["after"] is True
    assert seen["result"] == [[2.0 * 2**22, 1]]  # the rank finished, on one thread
    notices = [line for line in lines if line.startswith("nbaccel: this kernel ran a multi-threaded CPU op")]
    if len(os.sched_getaffinity(0)) > 1:  # where a rank would have had more than one thread
        assert len(notices) == 1 and "each rank runs with one CPU thread" in notices[0]
    assert "torch.set_num_threads(2) kept at 1" in done.stdout + done.stderr
