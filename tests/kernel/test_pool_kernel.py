"""Persistent workers inside a real kernel: they never outlive it, however it ends."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from nbaccel.testing import scaled
from tests.kernel_harness import alive, running_kernel, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

START = """
import nbaccel
pool = nbaccel.start_workers(2)
print([s.pid for s in pool.status()])
"""


def _worker_pids(kernel) -> list[int]:
    run = kernel.execute(START)
    assert run.status == "ok", run.error
    return [int(p) for p in run.stdout.strip().strip("[]").split(",")]


def _gone_within(pids: list[int], seconds: float) -> float:
    return wait_until(lambda: not any(alive(p) for p in pids), seconds, f"workers {pids} gone after their kernel ended")


def test_workers_keep_state_between_cells_in_a_kernel() -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        _worker_pids(kernel)
        assert kernel.execute("pool.push(x=20)").status == "ok"
        run = kernel.execute("pool.run_task(lambda ns: ns['x'] + int(__import__('os').environ['RANK']))")
        assert run.of_type("execute_result")[0]["content"]["data"]["text/plain"] == "[20, 21]"
        assert kernel.execute("pool.stop()").status == "ok"


def test_workers_exit_when_the_kernel_shuts_down_and_do_not_hold_it_up() -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        pids = _worker_pids(kernel)
        kernel_process = psutil.Process(kernel.pid)
        started = time.monotonic()
        kernel.client.shutdown()  # a shutdown_request, as JupyterLab sends it
        kernel_process.wait(timeout=scaled(10))
        assert time.monotonic() - started < scaled(5)
        _gone_within(pids, 2.0)


def test_workers_exit_when_the_kernel_is_restarted() -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        pids = _worker_pids(kernel)
        kernel.manager.restart_kernel(now=False)
        _gone_within(pids, 2.0)


@pytest.mark.orphans  # the workers of the killed kernel become ours (the subreaper's) to reap
def test_workers_exit_when_the_kernel_is_killed() -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as kernel:
        pids = _worker_pids(kernel)
        os.kill(kernel.pid, signal.SIGKILL)
        _gone_within(pids, 2.0)
