"""%%distributed with real ranks (2 CPU processes on gloo), forked and spawned from an IPython shell."""

from __future__ import annotations

import pytest
from IPython.core.interactiveshell import InteractiveShell

from nbaccel import RankFailedError

pytestmark = pytest.mark.timeout(60)


def test_two_forked_ranks_print_labelled_lines_and_return_their_values(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("offset = 10", store_history=True)
    cell = (
        "%%distributed -n 2 --text -o everyone\n"
        "import torch, torch.distributed as dist\n"
        "t = torch.tensor([state.process_index + 1.0])\n"
        "dist.all_reduce(t)\n"
        "print(f'rank {state.process_index} of {state.num_processes}, sum {t.item():g}')\n"
        "state.process_index * offset"
    )
    result = ip.run_cell(cell, store_history=True)
    assert result.success, result.error_in_exec
    assert result.result == 0
    assert ip.user_ns["everyone"] == [0, 10]
    assert "t" not in ip.user_ns
    lines = sorted(line for line in capsys.readouterr().out.splitlines() if line.startswith("[rank"))
    assert lines == ["[rank 0] rank 0 of 2, sum 3", "[rank 1] rank 1 of 2, sum 3"]


@pytest.mark.slow
def test_a_spawned_rank_fails_with_the_cells_line_in_its_traceback(ip: InteractiveShell) -> None:
    ip.run_cell("def check(rank):\n    if rank == 1:\n        raise KeyError('spawned rank 1')", store_history=True)
    cell = "%%distributed -n 2 --text --start-method spawn\nimport os\n\ncheck(int(os.environ['RANK']))\n"
    result = ip.run_cell(cell, store_history=True)
    error = result.error_in_exec
    assert isinstance(error, RankFailedError)
    assert error.rank == 1 and error.exc_type == "KeyError"
    # The cell travelled by its source: its file name and its own line survive in the spawned rank.
    assert ", line 4, in distributed_cell" in error.remote_traceback
    assert "check(int(os.environ['RANK']))" in error.remote_traceback


def test_state_is_nbaccels_partial_state_on_every_rank_and_a_cell_that_ignores_it_makes_no_group(ip: InteractiveShell) -> None:
    cell = (
        "%%distributed -n 2 --text -o seen\n"
        "import nbaccel, torch.distributed as dist\n"
        "untouched = dist.is_initialized()\n"
        "kind = isinstance(state, nbaccel.PartialState)\n"
        "still_untouched = dist.is_initialized()\n"
        "(untouched, kind, still_untouched, state.process_index, dist.is_initialized())"
    )
    result = ip.run_cell(cell, store_history=True)
    assert result.success, result.error_in_exec
    assert ip.user_ns["seen"] == [(False, True, False, 0, True), (False, True, False, 1, True)]
    ignored = ip.run_cell("%%distributed -n 2 --text -o groups\nimport torch.distributed as dist\ndist.is_initialized()", store_history=True)
    assert ignored.success and ip.user_ns["groups"] == [False, False]


def test_a_cell_that_makes_its_own_group_first_still_gets_a_working_state(ip: InteractiveShell) -> None:
    cell = "%%distributed -n 2 --text -o seen\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n(state.num_processes, state.process_index)"
    result = ip.run_cell(cell, store_history=True)
    assert result.success, result.error_in_exec
    assert ip.user_ns["seen"] == [(2, 0), (2, 1)]
