"""Where is each rank, in a real kernel: a hung %%distributed cell names each rank's notebook line."""

from __future__ import annotations

import pytest

from tests.kernel_harness import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

HUNG_CELL = """%%distributed -n 2 --timeout 10
import time, torch, torch.distributed as dist
t = torch.ones(1)
if state.process_index == 1:
    time.sleep(60)
dist.all_reduce(t)
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "%load_ext nbaccel"


def test_a_timed_out_cell_names_each_ranks_cell_line(kernel: Kernel) -> None:
    run = kernel.execute(HUNG_CELL, timeout=60)
    assert run.error is not None and run.error["ename"] == "LaunchTimeoutError"
    text = "\n".join(run.error["traceback"])
    count = run.reply["content"]["execution_count"]
    assert f"rank 0: in `dist.all_reduce` at Cell In[{count}], line 6" in text
    assert f"rank 1: in `time.sleep` at Cell In[{count}], line 5" in text
    assert f"Cell In[{count}], line 5 in distributed_cell" in run.stdout  # rank 1's stack, in its view
    assert kernel.children() == []


def test_workers_stacks_on_demand(kernel: Kernel) -> None:
    assert kernel.execute("import nbaccel; pool = nbaccel.start_workers(2)").status == "ok"
    try:
        run = kernel.execute(
            "import time\nfor _ in range(100):\n    s = [x.summary for x in pool.stacks()]\n    if all('idle' in x for x in s): break\n    time.sleep(0.05)\nprint(s)"
        )
        assert "rank 0: idle, waiting for the next cell" in run.stdout and "rank 1: idle" in run.stdout
    finally:
        assert kernel.execute("pool.stop()").status == "ok"
    assert kernel.children() == []


def test_the_stacks_command_says_where_each_worker_is(kernel: Kernel) -> None:
    assert kernel.execute("%distributed stacks").stdout.startswith("nbaccel: ")  # no workers: says so
    assert kernel.execute("%distributed start -n 2").status == "ok"
    try:
        run = kernel.execute("%distributed stacks")
        assert run.status == "ok", run.error
        lines = run.stdout.splitlines()
        assert [line.split(":")[0] for line in lines[:2]] == ["rank 0", "rank 1"]
        assert "── rank 1 ──" in run.stdout
    finally:
        assert kernel.execute("%distributed stop").status == "ok"
    assert kernel.children() == []
