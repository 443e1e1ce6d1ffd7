"""pdb on a rank, in a real kernel whose stdin is answered as JupyterLab answers it (input_request).

Each test types pdb commands at the prompts the cell opens (tests/kernel_harness.py, ``answers=``)
and checks what the rank printed, what the cell returned, and that nothing is left running.
"""

from __future__ import annotations

import re
import time

import pytest

from nbaccel.testing import scaled
from tests.kernel_harness import Execution, Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

BREAK_ON_RANK_1 = """%%distributed -n 2 -o both{options}
x = state.process_index * 10 + 7
if state.process_index == 1:
    breakpoint()
y = x + 1
y
"""


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "%load_ext nbaccel"


def _value(kernel: Kernel, expression: str) -> str:
    run = kernel.execute(f"print(repr({expression}))")
    assert run.status == "ok", run.error
    return run.stdout.strip()


def _said(run: Execution, rank: int) -> list[str]:
    """What ``rank`` printed into the cell in text output (its ``[rank N]`` lines), unlabelled."""
    prefix = f"[rank {rank}] "
    return [line.removeprefix(prefix) for line in run.stdout.splitlines() if line.startswith(prefix)]


def _every_line_shown(run: Execution) -> list[str]:
    """Every line the user sees in the cell: its stdout, and each prompt's text above the input box."""
    return run.stdout.splitlines() + [line for prompt in run.prompts for line in prompt.splitlines()]


def test_a_breakpoint_on_rank_1_prompts_in_the_cell_and_c_resumes(kernel: Kernel) -> None:
    run = kernel.execute(BREAK_ON_RANK_1.format(options=""), answers=["p x", "c"], timeout=90)
    assert run.status == "ok", run.error
    first, second = run.prompts
    assert first.startswith("nbaccel: rank 1 is at a breakpoint")
    assert "30 min on gloo, 10 min on NCCL" in first.splitlines()[0] and "init_process_group(timeout=" in first.splitlines()[0]
    assert first.endswith("\n(Pdb) rank 1> ") and second == "(Pdb) rank 1> "
    said = _said(run, 1)
    assert said[1:] == ["-> y = x + 1", "17"] and re.fullmatch(r"> .*\.py\(5\)distributed_cell\(\)", said[0])  # 17: rank 1's x, not rank 0's 7
    assert _value(kernel, "both") == "[8, 18]"
    assert kernel.children() == []


def test_in_text_output_each_line_pdb_prints_is_shown_once_labelled_with_its_rank(kernel: Kernel) -> None:
    run = kernel.execute(BREAK_ON_RANK_1.format(options=""), answers=["p x", "p x * 2", "c"], timeout=90)
    assert run.status == "ok", run.error
    shown = _every_line_shown(run)
    for line in ("-> y = x + 1", "17", "34"):
        assert [s for s in shown if s.endswith(line) and s.removeprefix("[rank 1] ") == line] == [f"[rank 1] {line}"], shown
    location = [s for s in shown if s.endswith("distributed_cell()")]
    assert len(location) == 1 and location[0].startswith("[rank 1] > "), shown
    assert run.prompts[1:] == ["(Pdb) rank 1> ", "(Pdb) rank 1> "]


WIDGETS_BREAK_ON_RANK_1 = """import nbaccel, os, tempfile
from nbaccel.output.choose import WidgetSink
def work():
    x = int(os.environ["RANK"]) * 10 + 7
    if x == 17:
        breakpoint()
    return x
logs = tempfile.mkdtemp()
values = nbaccel.notebook_launcher(work, num_processes=2, output=WidgetSink(log_root=logs))
"""


def test_in_widgets_output_pdbs_lines_are_in_the_ranks_view_and_beside_the_prompt(kernel: Kernel) -> None:
    run = kernel.execute(WIDGETS_BREAK_ON_RANK_1, answers=["p x", "c"], timeout=90)
    assert run.status == "ok", run.error
    assert "-> return x" in run.prompts[0] and run.prompts[1] == "17\n(Pdb) rank 1> "  # the rank's tab may not be the one shown
    assert "[rank 1]" not in run.stdout
    (final,) = run.of_type("update_display_data")  # the static view that replaced the widgets: each rank's panel
    ranks = final["content"]["data"]["application/vnd.nbaccel.ranks+json"]["ranks"]
    panel = ["".join(o.get("text", "") for o in ranks[rank]["outputs"] if o["output_type"] == "stream").splitlines() for rank in (0, 1)]
    assert panel[1][1:] == ["-> return x", "17"] and panel[1][0].endswith("work()") and panel[0] == []
    log = _value(kernel, "open(os.path.join(logs, os.listdir(logs)[0], 'rank1.log')).read().splitlines()")
    assert log.endswith("'-> return x', '17']")  # and in rank 1's log file
    assert _value(kernel, "values") == "[7, 17]"


def test_pdb_set_trace_and_pdb_Pdb_in_notebook_launcher(kernel: Kernel) -> None:
    code = (
        "import pdb, nbaccel\n"
        "def work(how):\n"
        "    import os\n"
        "    rank = int(os.environ['RANK'])\n"
        "    secret = f'rank-{rank}-value'\n"
        "    if rank == 1:\n"
        "        pdb.set_trace() if how == 'set_trace' else pdb.Pdb().set_trace()\n"
        "    return secret\n"
        "values = [nbaccel.notebook_launcher(work, (how,), num_processes=2) for how in ('set_trace', 'Pdb')]"
    )
    run = kernel.execute(code, answers=["p secret", "c", "p secret", "c"], timeout=120)
    assert run.status == "ok", run.error
    assert [line for line in _said(run, 1) if "value" in line] == ["'rank-1-value'", "'rank-1-value'"]
    assert all(p.endswith("(Pdb) rank 1> ") for p in run.prompts)
    assert _value(kernel, "values") == "[['rank-0-value', 'rank-1-value'], ['rank-0-value', 'rank-1-value']]"


def test_two_ranks_at_breakpoints_take_turns_lowest_first_each_for_its_whole_session(kernel: Kernel) -> None:
    cell = "%%distributed -n 2 -o both\nimport torch.distributed as dist\nr = state.process_index\ndist.barrier()\nbreakpoint()\nr * 2\n"
    run = kernel.execute(cell, answers=["p r", "n", "p r", "c", "p r", "c"], timeout=120)
    assert run.status == "ok", run.error
    ranks = [int(m.group(1)) for p in run.prompts for m in [re.search(r"\(Pdb\) rank (\d)> $", p)] if m]
    assert ranks == [0, 0, 0, 0, 1, 1]
    assert _said(run, 0).count("0") == 2 and _said(run, 1).count("1") == 1  # each rank's r, from its own frame
    assert _value(kernel, "both") == "[0, 2]"


def test_q_ends_the_rank_and_the_launch_fails_naming_it(kernel: Kernel) -> None:
    run = kernel.execute(BREAK_ON_RANK_1.format(options=""), answers=["q"], timeout=90)
    assert run.error is not None and run.error["ename"] == "RankFailedError"
    assert "rank 1 failed: BdbQuit: quit in the debugger" in run.error["evalue"]
    assert kernel.children() == []


def test_the_timeout_and_stall_clocks_stand_still_at_the_prompt(kernel: Kernel) -> None:
    def slowly(prompt: str) -> str:
        time.sleep(scaled(3.0))  # past --timeout 2 and --stall-report 1
        return "c"

    run = kernel.execute(BREAK_ON_RANK_1.format(options=" --timeout 2 --stall-report 1"), answers=slowly, timeout=90)
    assert run.status == "ok", run.error
    assert "no output for" not in run.stdout
    assert _value(kernel, "both") == "[8, 18]"


def test_without_stdin_a_breakpoint_says_so_in_one_line_and_goes_on(kernel: Kernel) -> None:
    run = kernel.execute(BREAK_ON_RANK_1.format(options=""), timeout=90)  # allow_stdin=False, as nbclient
    assert run.status == "ok", run.error
    count = run.reply["content"]["execution_count"]
    said = [line for line in (run.stdout + run.stderr).splitlines() if "passed a breakpoint" in line]
    assert said == [
        f"[rank 1] nbaccel: rank 1 passed a breakpoint at Cell In[{count}], line 5 without stopping: this frontend does not allow input (nbclient, nbconvert --execute, a script)"
    ]
    assert _value(kernel, "both") == "[8, 18]"


POST_MORTEM = """%%distributed -n 2 {options}
import torch, torch.distributed as dist
t = torch.ones(1)
if state.process_index == 1:
    local = 41
    local / 0
dist.all_reduce(t)
"""


def test_pdb_option_opens_a_post_mortem_in_the_failing_ranks_frame(kernel: Kernel) -> None:
    run = kernel.execute(POST_MORTEM.format(options="--pdb"), answers=["p local + 1", "ll", "q"], timeout=90)
    assert run.prompts[0].startswith("nbaccel: rank 1 raised ZeroDivisionError: division by zero; post-mortem")
    said = _said(run, 1)
    assert "42" in said
    assert any(line.endswith("    local / 0") for line in said[said.index("42") :])  # ll: the cell's lines
    assert run.error is not None and run.error["ename"] == "RankFailedError"
    text = "\n".join(run.error["traceback"])
    assert "rank 1 failed: ZeroDivisionError" in text
    assert "rank 0: in `dist.all_reduce`" in text  # held while the post-mortem ran, its stack taken
    assert kernel.children() == []


CATCH_THEN_FAIL_IN_THE_KERNEL = """import nbaccel
def fail_on_rank_1():
    import os
    if os.environ["RANK"] == "1":
        local = 5
        raise ValueError(local)
try:
    nbaccel.notebook_launcher(fail_on_rank_1, num_processes=2)
except nbaccel.RankFailedError:
    kernel_side = 3
    kernel_side / 0
"""


def test_ipythons_own_pdb_on_opens_the_ranks_post_mortem_and_not_its_own_on_the_kernels_error(kernel: Kernel) -> None:
    assert kernel.execute("%pdb on").status == "ok"
    try:
        # A third answer, for an "ipdb> " on nbaccel's frames, would be taken if IPython opened one.
        run = kernel.execute(POST_MORTEM.format(options=""), answers=["p local", "q", "q"], timeout=90)
        # Spared is that launch's error only: the kernel's own ZeroDivisionError still gets IPython's.
        other = kernel.execute(CATCH_THEN_FAIL_IN_THE_KERNEL, answers=["q", "p kernel_side", "q"], timeout=90)
        plain = kernel.execute("1 / 0", answers=["q"], timeout=30)  # and the next cell is as before
    finally:
        assert kernel.execute("%pdb off").status == "ok"
    assert run.prompts[0].startswith("nbaccel: rank 1 raised ZeroDivisionError")
    assert run.prompts[1:] == ["(Pdb) rank 1> "], run.prompts
    assert "41" in _said(run, 1)
    assert run.error is not None and run.error["ename"] == "RankFailedError"
    assert other.prompts[0].startswith("nbaccel: rank 1 raised ValueError: 5; post-mortem")
    assert other.prompts[1:] == ["ipdb> ", "ipdb> "], other.prompts
    assert "3" in other.stdout.splitlines() and other.error is not None and other.error["ename"] == "ZeroDivisionError"
    assert plain.prompts == ["ipdb> "]
    assert kernel.children() == []


def test_interrupt_at_the_prompt_stops_the_launch_within_5_s(kernel: Kernel) -> None:
    cell = BREAK_ON_RANK_1.format(options="")
    started = time.monotonic()
    run = kernel.execute(cell, answers=lambda prompt: None, interrupt_on="(Pdb) rank 1> ", timeout=60)
    assert run.error is not None and run.error["ename"] == "KeyboardInterrupt", run.error
    assert kernel.children() == []
    assert time.monotonic() - started < scaled(5.0) + 10  # the launch's start, then the interrupt
    after = kernel.execute(cell, answers=["c"], timeout=90)  # no prompt left behind takes the next answer
    assert after.status == "ok", after.error


def test_distributed_debug_opens_a_workers_last_failure_later(kernel: Kernel) -> None:
    assert kernel.execute("%distributed start -n 2").status == "ok"
    try:
        failed = kernel.execute(
            "%%distributed\nkept = state.process_index + 100\nif state.process_index == 1:\n    oops = kept * 2\n    raise ValueError('late look')\n"
        )
        assert failed.error is not None and "rank 1 failed: ValueError: late look" in failed.error["evalue"]
        run = kernel.execute("%distributed debug", answers=["p oops", "q"], timeout=60)
        assert run.status == "ok", run.error
        assert run.prompts[0].startswith("nbaccel: rank 1 raised ValueError: late look")
        assert "202" in _said(run, 1)
        again = kernel.execute("%distributed debug --rank 0")  # a UsageError: one line
        assert "UsageError: %distributed debug: rank 0 has no failed cell to debug" in again.stderr
        kept = kernel.execute("%%distributed -o k\nkept")  # the namespaces are kept
        assert kept.status == "ok", kept.error
        assert _value(kernel, "k") == "[100, 101]"
        at_once = kernel.execute(
            "%%distributed --pdb\nif state.process_index == 0:\n    here = kept - 1\n    raise KeyError(here)", answers=["p here", "q"], timeout=60
        )
        assert at_once.prompts[0].startswith("nbaccel: rank 0 raised KeyError: 99; post-mortem") and "99" in _said(at_once, 0)
        assert at_once.error is not None and "rank 0 failed: KeyError: 99" in at_once.error["evalue"]
        resumed = kernel.execute("%%distributed -o seen\nif state.process_index == 1:\n    breakpoint()\nkept", answers=["p kept", "c"], timeout=60)
        assert resumed.status == "ok", resumed.error
        assert resumed.prompts[0].endswith("(Pdb) rank 1> ") and "101" in _said(resumed, 1)
        assert _value(kernel, "seen") == "[100, 101]"
        quit_cell = kernel.execute("%%distributed\nif state.process_index == 1:\n    breakpoint()\n", answers=["q"], timeout=60)
        assert quit_cell.error is not None and "quit in the debugger" in quit_cell.error["evalue"]
        assert kernel.execute("%%distributed -o k\nkept").status == "ok"  # q failed the cell, not the pool
    finally:
        assert kernel.execute("%distributed stop").status == "ok"
    assert kernel.children() == []
