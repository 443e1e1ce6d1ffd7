"""Every example notebook runs top to bottom under nbclient (as CI and `jupyter nbconvert --execute` do)."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from nbaccel.testing import scaled

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]  # scaled by tests/conftest.py


def test_there_are_examples() -> None:
    names = [p.name for p in NOTEBOOKS]
    assert names[:4] == ["01_quickstart.ipynb", "02_ddp_training.ipynb", "03_execution_process.ipynb", "04_accelerate.ipynb"]
    assert {"06_hf_trainer.ipynb", "07_fsdp2.ipynb"} <= set(names)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_example_runs_without_errors(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit examples without outputs"
    client = NotebookClient(notebook, timeout=round(scaled(60)), kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}})
    started = time.monotonic()
    client.execute()  # raises CellExecutionError on the first cell that errors (unless tagged raises-exception)
    text = _all_text(notebook)
    assert "[rank 0]" in text, "no rank output reached the notebook"
    assert not _tagged_cells_that_did_not_raise(notebook), "a cell tagged raises-exception ran without an error"
    assert time.monotonic() - started < scaled(60), "examples must stay quick on a 2-core CPU machine"


def _tagged_cells_that_did_not_raise(notebook: nbformat.NotebookNode) -> list[str]:
    """Sources of the cells tagged raises-exception whose outputs hold no error (nbclient lets them pass either way)."""
    return [
        cell.source
        for cell in notebook.cells
        if cell.cell_type == "code"
        and "raises-exception" in cell.get("metadata", {}).get("tags", [])
        and not any(output.output_type == "error" for output in cell.get("outputs", []))
    ]


def test_a_tagged_cell_that_does_not_raise_is_caught() -> None:
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 + 1", metadata={"tags": ["raises-exception"]})])
    NotebookClient(notebook, timeout=30, kernel_name="python3").execute()
    assert _tagged_cells_that_did_not_raise(notebook) == ["1 + 1"]
    notebook.cells[0].source = "raise ValueError('expected')"
    NotebookClient(notebook, timeout=30, kernel_name="python3").execute()
    assert _tagged_cells_that_did_not_raise(notebook) == []


def _all_text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_a_breakpoint_and_pdb_under_nbclient_do_not_hang(tmp_path: Path) -> None:
    """nbclient allows no stdin: a breakpoint and a post-mortem each say so in one line and go on."""
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("%load_ext nbaccel"),
        nbformat.v4.new_code_cell("%%distributed -n 2 -o both\nx = state.process_index\nif x == 1:\n    breakpoint()\nx + 1"),
        nbformat.v4.new_code_cell(
            "%%distributed -n 2 --pdb\nif state.process_index == 1:\n    raise ValueError('no stdin here')", metadata={"tags": ["raises-exception"]}
        ),
        nbformat.v4.new_code_cell("print('both', both)"),
    ]
    client = NotebookClient(notebook, timeout=round(scaled(60)), kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    text = _all_text(notebook)
    assert "nbaccel: rank 1 passed a breakpoint at Cell In[2], line 5 without stopping" in text
    assert "nbaccel: rank 1 passed a post-mortem at Cell In[3], line 3 without stopping" in text
    (error,) = [o for o in notebook.cells[2].outputs if o.output_type == "error"]
    assert "rank 1 failed: ValueError: no stdin here" in error.evalue
    assert "both [1, 2]" in text
