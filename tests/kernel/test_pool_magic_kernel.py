"""%distributed workers and %%distributed cells on them, in a real ipykernel driven as a frontend does.

One kernel serves the module; each test starts its own workers and stops them (the leak check
allows no process a test started to outlive it).
"""

from __future__ import annotations

from collections.abc import Iterator

import psutil
import pytest

from nbaccel.testing import scaled
from tests.kernel_harness import Execution, Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "%load_ext nbaccel\nimport torch"


@pytest.fixture
def workers(kernel: Kernel) -> Iterator[Kernel]:
    """Two workers started in ``kernel`` for the test, stopped after it (whatever it did to them)."""
    run = ok(kernel, "%distributed start -n 2")
    assert run.stdout.startswith("nbaccel: 2 workers ready on cpu in "), run.stdout
    yield kernel
    kernel.execute("%distributed stop")
    assert psutil.Process(kernel.pid).children() == []


def ok(kernel: Kernel, code: str, **kwargs: float) -> Execution:
    run = kernel.execute(code, **kwargs)
    assert run.status == "ok", (run.error or run.reply["content"], run.stderr)
    return run


def result(run: Execution) -> str | None:
    results = run.of_type("execute_result")
    return results[0]["content"]["data"]["text/plain"] if results else None


def usage_error(run: Execution) -> str:
    assert run.reply["content"]["ename"] == "UsageError", run.reply["content"]
    return run.reply["content"]["evalue"]


def worker_pids(kernel: Kernel) -> list[int]:
    lines = ok(kernel, "%distributed status").shown.splitlines()
    assert lines[0].split()[:2] == ["rank", "pid"], lines
    return [int(line.split()[1]) for line in lines[1:]]


def test_a_variable_a_cell_defines_is_there_in_the_next_cell(workers: Kernel) -> None:
    first = ok(
        workers,
        "%%distributed\nimport torch, torch.distributed as dist\nt = torch.ones(1) * (state.process_index + 1)\ndist.all_reduce(t)\nprint(f'rank {state.process_index}: {t.item():g}')\nt.item()",
    )
    assert sorted(first.stdout.splitlines()) == ["[rank 0] rank 0: 3", "[rank 1] rank 1: 3"]
    assert result(first) == "3.0"
    second = ok(workers, "%%distributed -o everyone\nt += state.process_index\nt.item()")
    assert result(second) == "3.0"
    assert ok(workers, "print(everyone, 't' in globals())").stdout == "[3.0, 4.0] False\n"
    assert result(ok(workers, "%%distributed\nt.item();")) is None


def test_ranks_runs_a_cell_on_some_ranks(workers: Kernel) -> None:
    run = ok(workers, "%%distributed --ranks 1 -o only\nonly_here = state.process_index\nprint('ran')\nonly_here * 10")
    assert run.stdout == "[rank 1] ran\n" and result(run) == "10"
    assert ok(workers, "print(only)").stdout == "{1: 10}\n"
    assert result(ok(workers, "%%distributed -o seen\n'only_here' in globals()")) == "False"
    assert ok(workers, "print(seen)").stdout == "[False, True]\n"


def test_ranks_with_widgets_shows_only_those_ranks_running_from_the_start(workers: Kernel) -> None:
    run = ok(workers, "%%distributed --ranks 1 --widgets\nprint('only on rank 1')")
    (tab,) = [m["content"] for m in run.of_type("comm_open") if m["content"]["data"]["state"].get("_model_name") == "TabModel"]
    assert list(tab["data"]["state"]["titles"]) == ["rank 1 · waiting"] and tab["data"]["state"]["selected_index"] == 0
    titles = [
        m["content"]["data"]["state"]["titles"]
        for m in run.of_type("comm_msg")
        if m["content"]["comm_id"] == tab["comm_id"] and "titles" in m["content"]["data"].get("state", {})
    ]
    assert titles[0] == ["rank 1 · running"] and titles[-1] == ["rank 1 · done"]  # running before any output: the worker is up
    (final,) = run.of_type("update_display_data")
    plain = final["content"]["data"]["text/plain"]
    assert plain.splitlines()[0].startswith("nbaccel: rank 1 of 2, done in") and "only on rank 1" in plain and "rank 0" not in plain


def test_push_and_pull_between_the_notebook_and_the_ranks(workers: Kernel) -> None:
    ok(workers, "scale = 3\nbase = torch.arange(3.0)")
    ok(workers, "%distributed push scale base")
    ok(workers, "%%distributed\nweights = base * scale * (state.process_index + 1)")
    ok(workers, "%distributed pull weights --rank 1 -o from_one\n%distributed pull weights")
    check = ok(workers, "print(from_one.tolist(), weights.tolist(), weights.device)")
    assert check.stdout == "[0.0, 6.0, 12.0] [0.0, 3.0, 6.0] cpu\n"
    assert "'missing' is not defined on this rank" in usage_error(workers.execute("%distributed pull missing"))
    bad = workers.execute("import threading\nlock = threading.Lock()\n%distributed push lock")
    assert usage_error(bad).startswith("%distributed push: cannot push 'lock': a lock cannot be pickled")


def test_status_shows_every_rank(workers: Kernel) -> None:
    ok(workers, "%%distributed\nx = 1")
    lines = ok(workers, "%distributed status").shown.splitlines()
    assert lines[0].split() == ["rank", "pid", "device", "state", "cpu", "memory", "peak", "last", "cell"]
    for rank, line in enumerate(lines[1:]):
        fields = line.split()
        assert fields[0] == str(rank) and fields[2:4] == ["cpu", "idle"] and fields[4].endswith("%") and fields[6] in ("MiB", "GiB") and line.endswith("x = 1")
        assert psutil.Process(int(fields[1])).ppid() == workers.pid


def test_restart_gives_fresh_workers_with_empty_namespaces(workers: Kernel) -> None:
    before = worker_pids(workers)
    ok(workers, "%%distributed\nleftover = 1")
    assert "fresh namespaces" in ok(workers, "%distributed restart").stdout
    assert not set(before) & set(worker_pids(workers))
    assert result(ok(workers, "%%distributed\n'leftover' in globals()")) == "False"


def test_an_interrupt_stops_the_cell_and_keeps_the_workers_and_their_namespaces(workers: Kernel) -> None:
    ok(workers, "%%distributed\nkept = state.process_index + 40")
    pids = worker_pids(workers)
    run = workers.execute(
        "%%distributed\nimport time\nprint('sleeping', flush=True)\ntime.sleep(30)", interrupt_on=lambda out: out.count("sleeping") == 2, timeout=20
    )
    assert run.status == "error" and run.error["ename"] == "KeyboardInterrupt"
    assert run.elapsed < scaled(5)
    assert worker_pids(workers) == pids
    assert result(ok(workers, "%%distributed\nkept")) == "40"


def test_a_failing_rank_fails_the_cell_naming_it_and_the_workers_stay(workers: Kernel) -> None:
    pids = worker_pids(workers)
    run = workers.execute("%%distributed\nok = 1\nif state.process_index == 1:\n    raise ValueError('boom on workers')\n")
    assert run.error["ename"] == "RankFailedError"
    text = "\n".join(run.error["traceback"])
    assert "rank 1 failed: ValueError: boom on workers" in text
    assert "line 4, in <module>" in text and "raise ValueError('boom on workers')" in text
    assert worker_pids(workers) == pids


def test_a_crashing_rank_stops_the_workers_and_the_error_names_it(workers: Kernel) -> None:
    run = workers.execute("%%distributed\nimport os, signal, time\nif state.process_index == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\ntime.sleep(30)")
    assert run.error["ename"] == "RankFailedError"
    assert "rank 1 failed: killed by SIGKILL" in "\n".join(run.error["traceback"])
    assert "the workers were stopped" in run.stdout
    assert psutil.Process(workers.pid).children() == []
    assert "(or %distributed restart, with the same options)" in ok(workers, "%distributed status").shown
    after = ok(workers, "%%distributed -n 2\n5")
    assert after.stdout == "nbaccel: no workers running (stopped after a failure); one-shot launch of 2 ranks\n" and after.stderr == ""
    assert result(after) == "5"
    assert "workers ready" in ok(workers, "%distributed restart").stdout
    assert result(ok(workers, "%%distributed\n6")) == "6"


def test_destroy_process_group_in_a_cell_does_not_break_later_cells(workers: Kernel) -> None:
    run = ok(workers, "%%distributed\nimport torch.distributed as dist\ndist.destroy_process_group()\nstate.destroy_process_group()")
    assert run.stderr.count("destroy_process_group() is deferred until the workers stop") == 2  # once per rank
    later = ok(workers, "%%distributed\nimport torch\nt = torch.ones(1)\ndist.all_reduce(t)\nt.item()")
    assert result(later) == "2.0"


def test_one_shot_options_and_ranks_outside_the_world_are_usage_errors(workers: Kernel) -> None:
    assert usage_error(workers.execute("%%distributed -n 4\n1")).startswith("-n only apply to one-shot launches, but 2 workers are running")
    assert usage_error(workers.execute("%%distributed --ranks 0,5\n1")) == "--ranks 0,5: rank(s) 5 are outside the 2 running workers (ranks 0..1)."
    assert usage_error(workers.execute("%distributed start")).startswith("2 workers are already running")


def test_without_workers_a_cell_is_a_one_shot_launch_and_ranks_is_refused(kernel: Kernel) -> None:
    assert "no workers running" in ok(kernel, "%distributed stop").stdout
    ok(kernel, "get_ipython().magics_manager.registry['DistributedMagics'].workers.mode = None")  # a fresh session
    first = ok(kernel, "%%distributed -n 2\nstate.process_index + 7")
    assert first.stdout == "nbaccel: no workers running; one-shot launch of 2 ranks\n" and result(first) == "7"
    assert first.stderr == ""  # a notice is not an error: nothing red in the notebook
    assert ok(kernel, "%%distributed -n 2\n1").stdout == ""  # said once, not every cell
    refused = kernel.execute("%%distributed --ranks 0\n1")
    assert usage_error(refused).startswith("--ranks 0 needs running workers, and none are running")
    assert usage_error(kernel.execute("%distributed push x")).startswith("no workers running")


def test_state_on_the_workers_is_nbaccels_partial_state(workers: Kernel) -> None:
    ok(workers, "%%distributed -o kinds\nimport nbaccel\n(isinstance(state, nbaccel.PartialState), state.process_index)")
    assert ok(workers, "print(kinds)").stdout == "[(True, 0), (True, 1)]\n"


def test_free_collects_garbage_on_every_rank_and_says_what_each_freed(workers: Kernel) -> None:
    ok(
        workers,
        "%%distributed\nclass Cycle:\n    def __init__(self):\n        self.me, self.payload = self, bytearray(2**20)\nfor _ in range(64):\n    Cycle()",
    )
    lines = ok(workers, "%distributed free").stdout.splitlines()
    assert lines[0].split() == ["rank", "resident", "gpu", "cache", "objects", "collected"]
    for rank, line in enumerate(lines[1:]):
        fields = line.split()
        assert fields[0] == str(rank) and "->" in fields and fields[-2] == "-", line  # no GPU: no cache to return
        assert int(fields[-1]) >= 64, line  # the cycles the cell left behind
