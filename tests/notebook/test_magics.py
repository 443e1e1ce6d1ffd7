"""%%distributed in a real (terminal-less) IPython shell: options, errors, results, loading.

Imports internals (notebook.cell, notebook.magics): it tests those units directly, below the public face.
"""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

import nbaccel
from nbaccel import PreflightError, RankFailedError
from nbaccel.notebook.cell import Cell
from nbaccel.notebook.magics import CellSyntaxError, DistributedMagics
from nbaccel.testing import nbaccel_frames
from tests.notebook.stand_ins import Launches

pytestmark = pytest.mark.timeout(30)


def run(ip: InteractiveShell, line: str, cell: str = "1") -> object:
    return ip.run_cell_magic("distributed", line, cell)


# -- options -> notebook_launcher arguments -------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("", {}),  # the launcher's defaults (and NBACCEL_OUTPUT) decide
        ("-n 3", {"num_processes": 3}),
        ("--num-processes=3", {"num_processes": 3}),
        ("--gpus 0,2,3", {"gpus": (0, 2, 3)}),
        ("--gpus 1", {"gpus": (1,)}),
        ("--cpu", {"cpu": True}),
        ("--mixed-precision bf16", {"mixed_precision": "bf16"}),
        ("--start-method spawn", {"start_method": "spawn"}),
        ("--timeout 2.5", {"timeout": 2.5}),
        ("--max-restarts 2", {"max_restarts": 2}),
        ("--max-restarts 0", {"max_restarts": 0}),
        ("--text", {"output": "text"}),
        ("--widgets", {"output": "widgets"}),
        ("-o results", {}),
        ("-n 2 --text -o res --timeout 10", {"num_processes": 2, "output": "text", "timeout": 10.0}),
    ],
)
def test_options_become_launcher_arguments(ip: InteractiveShell, launches: Launches, line: str, expected: dict) -> None:
    run(ip, line)
    function, kwargs = launches[0]
    assert kwargs == expected
    assert isinstance(function, Cell)


def test_variables_in_the_magic_line_are_expanded(ip: InteractiveShell, launches: Launches) -> None:
    ip.user_ns["ranks"] = 4
    ip.run_cell("%%distributed -n $ranks\n1")
    assert launches.kwargs == {"num_processes": 4}


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("-n 0", "expected a whole number >= 1, got '0'"),
        ("-n two", "expected a whole number >= 1, got 'two'"),
        ("-n", "expected one argument"),
        ("--gpus a,b", "expected device indices separated by commas"),
        ("--gpus 0,,1", "expected device indices separated by commas"),
        ("--timeout 0", "expected a positive number of seconds"),
        ("--timeout nan", "expected a positive number of seconds"),
        ("--max-restarts -1", "expected a whole number >= 0"),
        ("--mixed-precision fp3", "invalid choice: 'fp3'"),
        ("--start-method thread", "invalid choice: 'thread'"),
        ("-o 1x", "expected a Python variable name"),
        ("-o class", "expected a Python variable name"),
        ("--bogus", "unrecognized arguments: --bogus"),
        ("4", "unrecognized arguments: 4"),
        ("--text --widgets", "--text and --widgets contradict each other"),
        ("--gpus 0 --cpu", "%%distributed: gpus and cpu=True contradict each other"),  # checked by LaunchOptions
        ("-o 'unclosed", "No closing quotation"),
    ],
)
def test_a_wrong_option_is_a_one_line_usage_error_and_nothing_starts(ip: InteractiveShell, launches: Launches, line: str, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        run(ip, line)
    message = str(caught.value)
    assert words in message
    assert "\n" not in message
    assert launches == []


def test_a_usage_error_shows_as_one_line_without_a_traceback(ip: InteractiveShell, launches: Launches, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("%%distributed -n 0\n1")
    captured = capsys.readouterr()
    assert captured.err == "UsageError: argument -n/--num-processes: expected a whole number >= 1, got '0'\n"
    assert "Traceback" not in captured.out


def test_a_cell_with_only_blank_lines_is_a_usage_error(ip: InteractiveShell, launches: Launches) -> None:
    with pytest.raises(UsageError, match="has none"):
        run(ip, "-n 2", "\n   \n")
    assert launches == []


@pytest.mark.parametrize(
    "error",
    [
        ValueError("num_processes=4 but only 2 GPU(s) are visible"),
        PreflightError("cannot fork the ranks: CUDA is already initialised in this kernel"),
    ],
)
def test_what_the_launcher_refuses_before_starting_is_a_usage_error(ip: InteractiveShell, launches: Launches, error: Exception) -> None:
    launches.raises = error
    with pytest.raises(UsageError) as caught:
        run(ip, "-n 4")
    assert str(caught.value) == f"%%distributed: {error}"


def test_a_rank_failure_is_not_turned_into_a_usage_error(ip: InteractiveShell, launches: Launches) -> None:
    launches.raises = RankFailedError.__new__(RankFailedError)
    with pytest.raises(RankFailedError):
        run(ip, "")


# -- the cell: result, names, state, syntax errors ------------------------------------------------


def test_the_result_is_rank_0s_value_and_out_stores_every_ranks(ip: InteractiveShell, launches: Launches) -> None:
    result = ip.run_cell("%%distributed -o everyone\nsecret = 21\nsecret * 2")
    assert result.success
    assert result.result == 42
    assert ip.user_ns["everyone"] == [42, "rank 1"]
    assert "secret" not in ip.user_ns  # the cell's names stay on the ranks


def test_a_trailing_semicolon_hides_the_result(ip: InteractiveShell, launches: Launches) -> None:
    result = ip.run_cell("%%distributed -o everyone\n21 * 2;")
    assert result.result is None
    assert ip.user_ns["everyone"] == [None, "rank 1"]


def test_the_cell_sees_the_notebooks_globals_and_state(ip: InteractiveShell, launches: Launches) -> None:
    ip.run_cell("def double(v):\n    return 2 * v\nbase = 20", store_history=True)
    assert ip.run_cell("%%distributed\ndouble(base) + 2").result == 42
    assert isinstance(ip.run_cell("%%distributed\nstate").result, nbaccel.PartialState)


def test_ipython_syntax_in_the_cell_works_as_in_any_cell(ip: InteractiveShell, launches: Launches) -> None:
    assert ip.run_cell("%%distributed\nlines = !echo one; echo two\nlen(lines)").result == 2


def test_a_syntax_error_is_raised_in_the_kernel_and_nothing_starts(ip: InteractiveShell, launches: Launches) -> None:
    with pytest.raises(CellSyntaxError) as caught:
        run(ip, "-n 2", "a = 1\nb = (\n")
    assert launches == []
    assert caught.value.syntax_error.lineno == 3  # counted from the %%distributed line
    rendered = "\n".join(caught.value._render_traceback_())
    assert "b = (" in rendered and "SyntaxError" in rendered


def test_a_syntax_error_shows_the_cell_line_not_nbaccels_frames(ip: InteractiveShell, launches: Launches, capsys: pytest.CaptureFixture[str]) -> None:
    result = ip.run_cell("%%distributed -n 2\nb = (\n", store_history=True)
    assert isinstance(result.error_in_exec, CellSyntaxError)
    out = capsys.readouterr().out
    assert f"Cell In[{result.execution_count}], line 2" in out
    assert "SyntaxError: '(' was never closed" in out
    assert nbaccel_frames(out) == []


def test_the_cell_is_compiled_under_its_own_name_counted_from_the_magic_line(ip: InteractiveShell, launches: Launches) -> None:
    result = ip.run_cell("%%distributed\n\nvalue = 1\nraise KeyError(value)", store_history=True)
    assert isinstance(result.error_in_exec, KeyError)  # the stand-in launcher runs rank 0 here
    function = launches[0][0]
    assert ip.compile.format_code_name(function.filename) == ("Cell", f"In[{result.execution_count}]")
    frames = [tb for tb in _frames(result.error_in_exec.__traceback__) if tb.tb_frame.f_code.co_filename == function.filename]
    assert [tb.tb_lineno for tb in frames] == [4]  # blank line kept: the notebook's line numbers


def _frames(tb):  # type: ignore[no-untyped-def]
    while tb is not None:
        yield tb
        tb = tb.tb_next


# -- help, loading, unloading --------------------------------------------------------------------


def test_help_lists_every_option(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("%%distributed?")
    text = capsys.readouterr().out
    assert "%%distributed [-n N]" in text
    for option in (
        "--num-processes N",
        "--gpus",
        "--cpu",
        "--mixed-precision",
        "--start-method",
        "--timeout SECONDS",
        "--max-restarts K",
        "--out NAME",
        "--text",
        "--widgets",
    ):
        assert option in text, option
    assert "state" in text and "last expression" in text


def test_the_cell_magic_and_the_workers_line_magic_are_registered(ip: InteractiveShell) -> None:
    assert ip.find_cell_magic("distributed") is not None
    assert ip.find_line_magic("distributed").__name__ == "distributed_line"


def test_unload_removes_the_magic_and_load_brings_it_back(ip: InteractiveShell) -> None:
    ip.run_line_magic("unload_ext", "nbaccel")
    try:
        assert ip.find_cell_magic("distributed") is None and ip.find_line_magic("distributed") is None
        assert DistributedMagics.__name__ not in ip.magics_manager.registry
    finally:
        ip.run_line_magic("load_ext", "nbaccel")
    assert ip.find_cell_magic("distributed") is not None
    ip.run_line_magic("reload_ext", "nbaccel")
    assert ip.find_cell_magic("distributed") is not None


def test_lazy_magics_config_loads_nbaccel_on_first_use(ip: InteractiveShell) -> None:
    ip.run_line_magic("unload_ext", "nbaccel")
    manager = ip.magics_manager
    saved = dict(manager.lazy_magics)
    manager.lazy_magics = {"distributed": "nbaccel"}
    try:
        assert ip.run_cell("%%distributed -n 2 --text\n6 * 7").result == 42  # real ranks: a fresh load has nbaccel's launcher
        assert "nbaccel" in ip.extension_manager.loaded
    finally:
        manager.lazy_magics = saved
        if "nbaccel" not in ip.extension_manager.loaded:
            ip.run_line_magic("load_ext", "nbaccel")
