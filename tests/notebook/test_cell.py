"""nbaccel.notebook.cell: a cell's source becomes a function (no IPython, no processes except one spawn check).

Imports internals (notebook.cell): it tests those units directly, below the public face.
"""

from __future__ import annotations
import __future__

import linecache
import pickle
import subprocess
import sys
import traceback
from collections.abc import Iterator

import cloudpickle
import pytest

import nbaccel
from nbaccel.notebook.cell import FUNCTION_NAME, Cell, compile_cell
from nbaccel.testing import nbaccel_frames, reset_all_states, scaled

pytestmark = pytest.mark.timeout(30)


# -- the last expression ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("6 * 7", 42),
        ("x = 6\nx * 7", 42),
        ("x = 6; x * 7", 42),
        ("x = 6\nx * 7  # the answer", 42),
        ("(6 *\n 7)", 42),
        ("x = 42", None),  # an assignment shows nothing, as in a notebook
        ("for i in range(3):\n    i", None),  # nor does an expression inside a block
        ("print('hi')", None),
        ("return 42\n0", 42),  # an explicit return works: the cell is a function body
        ("", None),
        ("# only a comment", None),
    ],
)
def test_the_value_of_the_last_expression_is_returned(source: str, expected: object) -> None:
    assert compile_cell(source)() == expected


@pytest.mark.parametrize("source", ["6 * 7;", "6 * 7 ;", "6 * 7;  # hidden", "x = 6\nx * 7;\n\n", "(6 *\n 7);"])
def test_a_trailing_semicolon_hides_the_value_but_the_expression_still_runs(source: str) -> None:
    ran = []
    cell = compile_cell(f"ran.append(1)\n{source}", {"ran": ran})
    assert cell() is None
    assert ran == [1]


def test_a_semicolon_inside_a_string_or_earlier_does_not_hide_the_value() -> None:
    assert compile_cell("x = 1;\n'a;'")() == "a;"


# -- names: what the cell sees and what it leaves ------------------------------------------------


def test_names_the_cell_assigns_do_not_leak_into_the_namespace() -> None:
    namespace = {"x": 1}
    source = "import math\ny = x + 1\ndef f():\n    return y\nclass K:\n    pass\nfor i in range(2):\n    j = i\nz = [k for k in range(3)]\nf()"
    assert compile_cell(source, namespace)() == 2
    assert namespace == {"x": 1}


def test_the_cell_reads_the_namespace_as_it_is_when_it_runs() -> None:
    namespace = {"x": 1}
    cell = compile_cell("x * 10", namespace)
    namespace["x"] = 4
    assert cell() == 40


def test_functions_defined_in_the_cell_see_its_locals_and_the_globals() -> None:
    source = "scale = 3\ndef f(v):\n    return v * scale + offset\n[f(v) for v in range(3)]"
    assert compile_cell(source, {"offset": 1})() == [1, 4, 7]


def test_future_flags_of_the_notebook_compiler_apply() -> None:
    source = "def f(x: NotDefinedAnywhere) -> int:\n    return 1\nf(0)"
    with pytest.raises(NameError):
        compile_cell(source)()
    assert compile_cell(source, flags=__future__.annotations.compiler_flag)() == 1


# -- state ---------------------------------------------------------------------------------------


@pytest.fixture
def no_state() -> Iterator[None]:
    """No process state set up in this process before the test, nor after it."""
    reset_all_states()
    yield
    reset_all_states()


def test_state_is_nbaccels_partial_state_set_up_only_when_the_cell_reads_it(no_state: None) -> None:
    assert compile_cell("isinstance(state, nbaccel.PartialState)", {"nbaccel": nbaccel})() is True
    assert compile_cell("1 + 1")() == 2
    assert compile_cell("repr(state)")() == "<state: nbaccel.PartialState, set up on first use>"
    assert compile_cell("state.initialized")() is False  # nothing read yet: nothing set up
    assert compile_cell("state.process_index, state.num_processes")() == (0, 1)
    assert nbaccel.PartialState().initialized and compile_cell("state.initialized")()
    assert "Num processes: 1" in compile_cell("repr(state)")()


def test_state_outlives_a_reset_and_pickles_without_setting_anything_up(no_state: None) -> None:
    cell = compile_cell("state.num_processes")
    assert cell() == 1
    reset_all_states()  # what a fork does to the kernel's state in a rank
    assert cell() == 1  # set up again, not "made before _reset_state()"
    reset_all_states()
    copy = pickle.loads(pickle.dumps(compile_cell("state")()))
    assert isinstance(copy, nbaccel.PartialState) and not copy.initialized


def test_a_global_named_state_does_not_replace_nbaccels() -> None:
    assert isinstance(compile_cell("state", {"state": "the notebook's"})(), nbaccel.PartialState)


# -- errors --------------------------------------------------------------------------------------


def test_a_syntax_error_is_raised_at_compile_time_with_the_cells_line() -> None:
    with pytest.raises(SyntaxError) as caught:
        compile_cell("a = 1\nb = (\n", header="%%distributed -n 2")
    assert caught.value.lineno == 3  # the magic's line is line 1, as the notebook shows the cell
    assert caught.value.filename.startswith("<nbaccel-cell-")


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("yield 1", "'yield' outside function"),
        ("x = [1]\nyield from x", "'yield' outside function"),
        ("await thing()", "asyncio.run"),
        ("from os import *", "import the names you use"),
    ],
)
def test_what_a_function_body_cannot_hold_is_a_syntax_error_that_says_why(source: str, words: str) -> None:
    with pytest.raises(SyntaxError, match=words.replace("(", r"\(").replace(")", r"\)")) as caught:
        compile_cell(source)
    assert caught.value.text is not None  # the offending line is shown


def test_yield_inside_a_function_the_cell_defines_is_fine() -> None:
    assert compile_cell("def g():\n    yield 1\nlist(g())")() == [1]


def test_a_runtime_traceback_shows_the_cells_own_lines_numbered_as_in_the_notebook() -> None:
    cell = compile_cell("\na = 1\nraise ValueError(a)", header="%%distributed -n 2")
    with pytest.raises(ValueError) as caught:
        cell()
    text = "".join(traceback.format_exception(caught.value))
    assert f'"{cell.filename}", line 4, in {FUNCTION_NAME}' in text
    assert "raise ValueError(a)" in text
    assert nbaccel_frames(text) == []  # no frame of nbaccel's between the caller and the cell


def test_the_source_is_cached_under_the_name_the_cache_callback_gives() -> None:
    seen = []

    def cache(text: str) -> str:
        seen.append(text)
        linecache.cache["<my cell>"] = (len(text), None, text.splitlines(True), "<my cell>")
        return "<my cell>"

    cell = compile_cell("x = 1", header="%%distributed", cache=cache)
    assert seen == ["%%distributed\nx = 1"]
    assert cell.filename == "<my cell>"
    assert cell.function.__code__.co_filename == "<my cell>"


# -- pickling ------------------------------------------------------------------------------------


def _helper(v: int) -> int:
    return v + 1


def test_cloudpickle_round_trip_keeps_behaviour_globals_and_file_name() -> None:
    namespace = {"__name__": "__main__", "x": 41, "helper": _helper, "unused": object()}
    cell = compile_cell("class K:\n    v = x\nhelper(K.v)", namespace, header="%%distributed")
    copy = pickle.loads(cloudpickle.dumps(cell))
    assert isinstance(copy, Cell)
    assert copy() == 42
    assert copy.filename == cell.filename
    assert set(cell.globals_used()) == {"__name__", "x", "helper"}  # only what the cell uses travels


@pytest.mark.slow
def test_a_cell_runs_in_a_fresh_interpreter_and_its_traceback_shows_its_lines() -> None:
    """What a spawned rank (or a remote worker) does: unpickle, run, format the traceback."""
    namespace = {"__name__": "__main__", "limit": 2, "square": lambda v: v * v}
    cell = compile_cell("values = [square(v) for v in range(3)]\nif max(values) > limit:\n    raise RuntimeError(values)", namespace, header="%%distributed")
    child = "import pickle, sys, traceback\ncell = pickle.loads(sys.stdin.buffer.read())\ntry:\n    cell()\nexcept RuntimeError:\n    traceback.print_exc()\n"
    done = subprocess.run([sys.executable, "-c", child], input=cloudpickle.dumps(cell), capture_output=True, timeout=scaled(20))
    err = done.stderr.decode()
    assert f'"{cell.filename}", line 4, in {FUNCTION_NAME}' in err
    assert "raise RuntimeError(values)" in err
    assert "RuntimeError: [0, 1, 4]" in err
