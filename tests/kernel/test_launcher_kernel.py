"""notebook_launcher inside a real ipykernel: the real case, with its threads and zmq sockets."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from nbaccel.testing import nbaccel_frames
from tests.kernel_harness import Kernel, alive, running_kernel, wait_until

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

DEFINE = """
import os, time, signal, json
import nbaccel

def hello(x):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([dist.get_rank() + 1.0]); dist.all_reduce(t)
    print(f"hello from rank {dist.get_rank()}, sum {t.item():g}")
    return dist.get_rank() * x

def boom():
    if os.environ["RANK"] == "1":
        print("rank 1 says goodbye")
        raise ValueError("boom from the notebook")
    time.sleep(30)

def hang(path):
    with open(path + os.environ["RANK"], "w") as f:
        f.write(str(os.getpid()))
    print("ready", flush=True)
    time.sleep(60)

def handlers():
    return {s.name: repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return DEFINE


def test_launch_output_lands_in_the_cell_labelled_and_the_result_is_the_cell_value(kernel: Kernel) -> None:
    run = kernel.execute("nbaccel.notebook_launcher(hello, args=(10,), num_processes=2)")
    assert run.status == "ok"
    lines = sorted(run.stdout.splitlines())
    assert lines == ["[rank 0] hello from rank 0, sum 3", "[rank 1] hello from rank 1, sum 3"]
    [result] = run.of_type("execute_result")
    assert result["content"]["data"]["text/plain"] == "[0, 10]"
    assert kernel.children() == []


def test_a_failing_rank_shows_its_notebook_traceback_not_the_launcher(kernel: Kernel) -> None:
    run = kernel.execute("nbaccel.notebook_launcher(boom, num_processes=2)")
    assert run.status == "error"
    error = run.error
    assert error["ename"] == "RankFailedError"
    text = "\n".join(error["traceback"])
    assert "rank 1 failed: ValueError: boom from the notebook" in text
    assert 'raise ValueError("boom from the notebook")' in text  # the cell's own source line
    assert "Cell In[" in text  # named as IPython names cells, not by a temp file
    assert "rank 1 says goodbye" in text
    assert nbaccel_frames(text) == []  # the kernel-side stack is not shown
    assert kernel.children() == []


def test_interrupt_stops_every_rank_keeps_handlers_and_the_next_launch_works(kernel: Kernel, tmp_path) -> None:
    before = kernel.execute("print(json.dumps(handlers()))").stdout
    launch = f"nbaccel.notebook_launcher(hang, args=({str(tmp_path)!r} + '/pid',), num_processes=2)"
    run = kernel.execute(launch, interrupt_on=lambda output: output.count("ready") == 2)  # both ranks run
    assert run.status == "error" and run.error["ename"] == "KeyboardInterrupt"
    pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
    wait_until(lambda: not any(psutil.pid_exists(p) for p in pids), 5, f"ranks {pids} gone after the interrupt")
    assert kernel.execute("print(json.dumps(handlers()))").stdout == before
    again = kernel.execute("nbaccel.notebook_launcher(hello, args=(1,), num_processes=2)")
    assert again.status == "ok" and again.of_type("execute_result")[0]["content"]["data"]["text/plain"] == "[0, 1]"


@pytest.mark.orphans  # the ranks of the killed kernel become ours (the subreaper's) to reap
def test_ranks_exit_when_the_kernel_is_killed(tmp_path) -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "text"}) as k:
        assert k.execute(DEFINE).status == "ok"
        k.client.execute(f"nbaccel.notebook_launcher(hang, args=({str(tmp_path)!r} + '/pid',), num_processes=2)")
        wait_until(lambda: all((tmp_path / f"pid{r}").is_file() and (tmp_path / f"pid{r}").read_text() for r in range(2)), 20, "both ranks started")
        pids = [int((tmp_path / f"pid{r}").read_text()) for r in range(2)]
        os.kill(k.pid, signal.SIGKILL)
        wait_until(lambda: not any(alive(p) for p in pids), 2.0, f"ranks {pids} gone after their kernel was killed")


def test_remote_tracebacks_name_notebook_cells_everywhere_they_are_shown(kernel: Kernel) -> None:
    # The widget panel and the static view show outcome.error.traceback: it names the cell too.
    run = kernel.execute(
        "try:\n    nbaccel.notebook_launcher(boom, num_processes=2)\nexcept nbaccel.RankFailedError as error:\n    print(error.outcomes[1].error.traceback)"
    )
    assert run.status == "ok"
    assert "Cell In[" in run.stdout and "ipykernel_" not in run.stdout
