"""Every example notebook runs top to bottom under nbclient (as CI and `jupyter nbconvert --execute` do)."""

from __future__ import annotations

import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NOTEBOOKS = sorted(EXAMPLES.glob("*.ipynb"))

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


def test_there_are_examples() -> None:
    assert [p.name for p in NOTEBOOKS][:4] == ["01_quickstart.ipynb", "02_ddp_training.ipynb", "03_execution_process.ipynb", "04_accelerate.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_example_runs_without_errors(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    assert all(not cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), "commit examples without outputs"
    client = NotebookClient(notebook, timeout=60, kernel_name="python3", resources={"metadata": {"path": str(EXAMPLES)}})
    started = time.monotonic()
    client.execute()  # raises CellExecutionError on the first cell that errors (unless tagged raises-exception)
    text = _all_text(notebook)
    assert "[rank 0]" in text, "no rank output reached the notebook"
    assert time.monotonic() - started < 60, "examples must stay quick on a 2-core CPU machine"


def _all_text(notebook: nbformat.NotebookNode) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "".join(parts)
