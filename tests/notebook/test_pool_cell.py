"""nbaccel.notebook.cell.compile_pool_cell and nbaccel.notebook.pool_cells: a cell for persistent workers, in-process.

Imports internals (notebook.cell, notebook.pool_cells): it tests those units directly, below the public face.
"""

from __future__ import annotations
import __future__

import linecache
import pickle
import subprocess
import sys
import threading
import traceback

import cloudpickle
import pytest
import torch

import nbaccel
from nbaccel.notebook.cell import PoolCell, compile_pool_cell, predefined_state
from nbaccel.notebook.pool_cells import CellTask, RankRepr, portable
from nbaccel.testing import scaled

pytestmark = pytest.mark.timeout(30)


# -- the namespace is the globals -----------------------------------------------------------------


def test_names_the_cell_assigns_persist_in_the_namespace_for_the_next_cell() -> None:
    namespace: dict = {"state": predefined_state()}
    assert compile_pool_cell("import math\nw = 20\ndef f(v):\n    return v + w\nclass K:\n    pass")(namespace) is None
    assert set(namespace) >= {"math", "w", "f", "K"}
    assert compile_pool_cell("w += 1\nf(21)")(namespace) == 42
    assert isinstance(namespace["state"], nbaccel.PartialState)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("6 * 7", 42),
        ("x = 6\nx * 7", 42),
        ("x = 6; x * 7", 42),
        ("(6 *\n 7)  # c", 42),
        ("x = 42", None),
        ("for i in range(2):\n    i", None),
        ("", None),
        ("# c", None),
    ],
)
def test_the_last_expression_is_the_value(source: str, expected: object) -> None:
    assert compile_pool_cell(source)({}) == expected


@pytest.mark.parametrize("source", ["ran.append(1)\n6 * 7;", "ran.append(1)\n(6 *\n 7);  # hidden"])
def test_a_trailing_semicolon_hides_the_value_but_it_still_runs(source: str) -> None:
    namespace = {"ran": []}
    assert compile_pool_cell(source)(namespace) is None
    assert namespace["ran"] == [1]


def test_module_level_code_works_as_in_a_notebook_cell() -> None:
    namespace: dict = {}
    assert compile_pool_cell("from math import *\nglobal g\ng = floor(pi)\ng")(namespace) == 3
    assert namespace["g"] == 3 and "sqrt" in namespace


def test_future_flags_of_the_notebook_compiler_apply() -> None:
    source = "def f(x: NotDefinedAnywhere) -> int:\n    return 1\nf(0)"
    with pytest.raises(NameError):
        compile_pool_cell(source)({})
    assert compile_pool_cell(source, flags=__future__.annotations.compiler_flag)({}) == 1


# -- file name, header, line numbers ----------------------------------------------------------------


def test_tracebacks_show_the_cells_line_counted_from_the_header() -> None:
    cell = compile_pool_cell("x = 1\nraise ValueError(x)", header="%%distributed\n")
    with pytest.raises(ValueError) as caught:
        cell({})
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == (cell.filename, 4, "raise ValueError(x)")
    assert linecache.getline(cell.filename, 1) == "%%distributed\n"


def test_the_cache_callback_names_the_file() -> None:
    texts = []
    cell = compile_pool_cell("1", header="%%distributed", cache=lambda text: texts.append(text) or "<cell-7>")
    assert cell.filename == "<cell-7>" and texts == ["%%distributed\n1"]


def test_it_pickles_by_source_and_keeps_its_file_name_and_lines() -> None:
    cell = compile_pool_cell("y = 2\nraise KeyError(y)", header="%%distributed --ranks 0")
    del linecache.cache[cell.filename]  # as in a worker forked before the cell existed
    copy = pickle.loads(cloudpickle.dumps(cell))
    assert isinstance(copy, PoolCell) and copy.filename == cell.filename
    with pytest.raises(KeyError) as caught:
        copy({})
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert (frame.filename, frame.lineno, frame.line) == (cell.filename, 3, "raise KeyError(y)")


def test_an_unpickled_cell_shows_its_lines_in_a_fresh_interpreter() -> None:
    payload = cloudpickle.dumps(compile_pool_cell("z = 3\nraise KeyError('fresh')", header="%%distributed"))
    script = "import pickle, sys, traceback\ncell = pickle.loads(sys.stdin.buffer.read())\ntry:\n    cell({})\nexcept KeyError:\n    traceback.print_exc()"
    done = subprocess.run([sys.executable, "-c", script], input=payload, capture_output=True, timeout=scaled(20))
    assert ", line 3, in <module>" in done.stderr.decode() and "raise KeyError('fresh')" in done.stderr.decode()


# -- syntax errors --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "words"),
    [
        ("x = (", "'(' was never closed"),
        ("return 1", "end it with the expression to show"),
        ("await f()", "call asyncio.run(...) in it"),
        ("yield 1", "'yield' outside function"),
    ],
)
def test_a_syntax_error_is_raised_at_compile_time_with_the_cells_file_and_line(source: str, words: str) -> None:
    with pytest.raises(SyntaxError) as caught:
        compile_pool_cell(f"ok = 1\n{source}", header="%%distributed", cache=lambda text: "<cell-3>")
    assert words in caught.value.msg
    assert (caught.value.filename, caught.value.lineno) == ("<cell-3>", 3)


# -- the task and its value -----------------------------------------------------------------------


def test_only_the_asked_ranks_send_their_value(monkeypatch: pytest.MonkeyPatch) -> None:
    task = CellTask(compile_pool_cell("n = 7\nn * 6"), value_ranks=(1,), exact=True)
    monkeypatch.setenv("RANK", "0")
    namespace: dict = {}
    assert task(namespace) is None and namespace["n"] == 7  # the cell ran; its value stayed
    monkeypatch.setenv("RANK", "1")
    assert task({}) == 42


def test_a_shown_value_that_cannot_be_pickled_comes_back_as_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    shown = CellTask(compile_pool_cell("lock"), value_ranks=(0,), exact=False)({"lock": threading.Lock()})
    back = pickle.loads(pickle.dumps(shown))
    assert isinstance(back, RankRepr) and "lock" in repr(back)
    assert pickle.loads(pickle.dumps(CellTask(compile_pool_cell("[1, 2]"), (0,), False)({}))) == [1, 2]
    with pytest.raises(TypeError):  # -o asks for the objects: no silent stand-in
        pickle.dumps(CellTask(compile_pool_cell("lock"), (0,), exact=True)({"lock": threading.Lock()}))


def test_a_module_travels_as_its_text_other_values_as_they_are() -> None:
    model = torch.nn.Linear(2, 1)
    assert isinstance(portable(model), RankRepr) and repr(portable(model)) == repr(model)
    value = {"w": torch.ones(2)}
    assert portable(value) is value
