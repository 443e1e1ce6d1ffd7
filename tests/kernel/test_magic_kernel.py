"""%%distributed in a real ipykernel, driven through jupyter_client as a notebook frontend drives it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nbaccel.testing import nbaccel_frames
from tests.kernel_harness import Execution, Kernel, running_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(90)]


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "%load_ext nbaccel"


def _no_ranks_left(kernel: Kernel) -> None:
    assert kernel.children() == []


def _result_text(run: Execution) -> str | None:
    results = run.of_type("execute_result")
    return results[0]["content"]["data"]["text/plain"] if results else None


def rank_lines(run: Execution) -> list[str]:
    """The cell's output lines from the ranks (not nbaccel's own notices, such as "one-shot launch")."""
    return [line for line in run.stdout.splitlines() if not line.startswith("nbaccel: ")]


def _traceback(run: Execution) -> str:
    assert run.error is not None, run.stdout + run.stderr
    return "\n".join(run.error["traceback"])


def test_load_ext_registers_the_cell_magic_and_the_workers_line_magic(kernel: Kernel) -> None:
    run = kernel.execute("ip = get_ipython(); print(ip.find_cell_magic('distributed') is not None, ip.find_line_magic('distributed').__name__)")
    assert run.stdout == "True distributed_line\n"


def test_the_cell_runs_on_every_rank_with_labelled_output_and_rank_0s_value_as_out(kernel: Kernel) -> None:
    run = kernel.execute(
        "%%distributed -n 2\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.tensor([state.process_index + 1.0]); dist.all_reduce(t)\n"
        "print(f'hello from rank {state.process_index} of {state.num_processes}, sum {t.item():g}')\n"
        "state.process_index + 100"
    )
    assert run.status == "ok", run.stderr
    assert sorted(rank_lines(run)) == ["[rank 0] hello from rank 0 of 2, sum 3", "[rank 1] hello from rank 1 of 2, sum 3"]
    assert _result_text(run) == "100"
    _no_ranks_left(kernel)


def test_out_stores_every_ranks_value_and_the_cells_names_stay_on_the_ranks(kernel: Kernel) -> None:
    run = kernel.execute("%%distributed -n 2 -o everyone\nsecret = state.process_index\nsecret * 10")
    assert run.status == "ok"
    assert _result_text(run) == "0"
    check = kernel.execute("print(everyone, 'secret' in globals())")
    assert check.stdout == "[0, 10] False\n"


def test_a_trailing_semicolon_shows_no_result(kernel: Kernel) -> None:
    run = kernel.execute("%%distributed -n 2\nstate.process_index + 100;")
    assert run.status == "ok"
    assert _result_text(run) is None


def test_a_failing_rank_makes_the_cell_fail_naming_the_rank_and_the_cells_line(kernel: Kernel) -> None:
    run = kernel.execute("%%distributed -n 2\nif state.process_index == 1:\n    print('rank 1 gives up')\n    raise ValueError('boom in the cell')\n")
    assert run.status == "error"
    assert run.error["ename"] == "RankFailedError"
    text = _traceback(run)
    assert "rank 1 failed: ValueError: boom in the cell" in text
    assert "line 4, in distributed_cell" in text  # counted from the %%distributed line
    assert "raise ValueError('boom in the cell')" in text
    assert nbaccel_frames(text) == []
    _no_ranks_left(kernel)


def test_a_syntax_error_fails_the_cell_at_once_without_starting_a_rank(kernel: Kernel) -> None:
    spy = kernel.execute(
        "from nbaccel.notebook.magics import register as _register\n"
        "import nbaccel\n"
        "_calls = []\n"
        "_register(get_ipython(), launch=lambda *a, **k: _calls.append(1) or nbaccel.notebook_launcher(*a, **k))"
    )
    assert spy.status == "ok", spy.error
    try:
        assert kernel.execute("%%distributed -n 2\n1").status == "ok"
        assert kernel.execute("print(len(_calls))").stdout == "1\n"  # the spy sees launches
        run = kernel.execute("%%distributed -n 2\nprint('never')\nx = (\n")
        assert run.status == "error"
        assert run.error["ename"] == "CellSyntaxError"
        text = _traceback(run)
        assert "SyntaxError" in text and "x = (" in text and "line 3" in text
        assert nbaccel_frames(text) == []
        assert run.stdout == ""
        assert kernel.execute("print(len(_calls))").stdout == "1\n"
    finally:
        kernel.execute("_register(get_ipython())")


def test_a_wrong_option_is_a_one_line_usage_error(kernel: Kernel) -> None:
    run = kernel.execute("%%distributed -n zero\n1")
    assert run.status == "error"
    # ipykernel reports a UsageError in the reply and on stderr, with no traceback.
    assert run.reply["content"]["ename"] == "UsageError"
    assert run.stderr == "UsageError: argument -n/--num-processes: expected a whole number >= 1, got 'zero'\n"


def test_help_shows_the_options(kernel: Kernel) -> None:
    run = kernel.execute("%%distributed?")
    assert run.status == "ok"
    pages = [p for p in run.reply["content"].get("payload", []) if p.get("source") == "page"]
    text = pages[0]["data"]["text/plain"]
    for option in ("--num-processes", "--gpus", "--mixed-precision", "--start-method", "--timeout", "--max-restarts", "--out", "--text", "--widgets"):
        assert option in text, option


def test_unload_ext_removes_the_magic(kernel: Kernel) -> None:
    assert kernel.execute("%unload_ext nbaccel").status == "ok"
    try:
        run = kernel.execute("%%distributed -n 2\n1")
        assert run.status == "error"
        assert "Cell magic `%%distributed` not found" in run.reply["content"]["evalue"]
    finally:
        assert kernel.execute("%load_ext nbaccel").status == "ok"
    assert kernel.execute("%%distributed -n 2 --text\n7").status == "ok"


@pytest.mark.parametrize(
    "config",
    [
        'c.InteractiveShellApp.extensions = ["nbaccel"]',
        'c.MagicsManager.lazy_magics = {"distributed": "nbaccel"}',
    ],
)
def test_ipython_config_loads_nbaccel_without_load_ext(tmp_path: Path, config: str) -> None:
    profile = tmp_path / "profile_default"
    profile.mkdir()
    (profile / "ipython_kernel_config.py").write_text(f"c = get_config()\n{config}\n")
    with running_kernel(env={"IPYTHONDIR": str(tmp_path), "NBACCEL_OUTPUT": "text"}) as k:
        run = k.execute("%%distributed -n 2\nstate.process_index + 1")
        assert run.status == "ok", run.error
        assert _result_text(run) == "1"


def test_a_text_mode_cell_ends_with_each_ranks_peak_memory_and_cpu_time(kernel: Kernel) -> None:
    """What the widget view's last chips say, in the closing lines (nbclient, papermill, terminals)."""
    run = kernel.execute("%%distributed -n 2\nimport time\ndeadline = time.process_time() + 2.5\nwhile time.process_time() < deadline:\n    pass\n")
    assert run.status == "ok", run.stderr
    closing = [line for line in run.stdout.splitlines() if line.startswith("nbaccel: rank ")]
    assert [line.split(":")[1] for line in closing] == [" rank 0", " rank 1"], run.stdout
    for line in closing:  # sampled about once a second: the CPU time at the last sample, a second or more
        match = re.fullmatch(r"nbaccel: rank \d: peak [\d.]+ (MiB|GiB) · cpu ([\d.]+) s", line)
        assert match and float(match.group(2)) >= 0.9, line
    _no_ranks_left(kernel)
