"""Where nobody watches a widget: papermill (a notebook run headless, as pipelines run it) and
terminal IPython (``ipython -c``). Both get labelled text on their own (no ``--text`` given).

papermill: every rank's lines are saved in the output notebook, labelled, ``-o`` keeps every
rank's value, and a failing rank fails the run with its error. Terminal IPython: the lines are
labelled, rank 0's value is the cell's ``Out``, and a failing rank makes ``ipython -c`` exit 1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nbaccel.testing import scaled

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(180)]

nbformat = pytest.importorskip("nbformat")
papermill = pytest.importorskip("papermill", reason="papermill is not installed (the test extra has it)")

GOOD = """%%distributed -n 2 -o values
print(f"hello from rank {state.process_index}")
state.process_index * 10"""
LOUD = """%%distributed -n 2
import sys
if state.process_index == 1:
    for i in range(200_000):
        sys.stdout.write(f"loud line {i} " + "x" * 40 + "\\n")
print("done", state.process_index)"""
BAD = """%%distributed -n 2
print(f"before the error on rank {state.process_index}", flush=True)
if state.process_index == 1:
    raise ValueError("rank 1 broke")"""


@pytest.fixture
def headless_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Nothing forces the output: the kernel must choose text by itself."""
    monkeypatch.delenv("NBACCEL_OUTPUT", raising=False)
    monkeypatch.setenv("NBACCEL_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("NBACCEL_FORK_SERVER", "lazy")  # no fork server left behind by the kernel's import
    return dict(os.environ)


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nbformat.write(nb, path)
    return path


def _text(cell: dict[str, object]) -> str:
    parts = []
    for output in cell.get("outputs", []):  # type: ignore[attr-defined]
        if output.get("output_type") == "stream":
            parts.append(output["text"])
        elif "data" in output:
            parts.append(output["data"].get("text/plain", ""))
    return "".join(parts)


def test_papermill_saves_every_ranks_lines_labelled_and_the_values(tmp_path: Path, headless_env: dict[str, str]) -> None:
    source = _notebook(tmp_path / "in.ipynb", "%load_ext nbaccel", GOOD, "print('values', values)")
    papermill.execute_notebook(str(source), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False, execution_timeout=int(scaled(120)))
    cells = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    launch = _text(cells[1])
    assert "[rank 0] hello from rank 0" in launch and "[rank 1] hello from rank 1" in launch
    assert "application/vnd.jupyter.widget-view+json" not in str(cells[1]["outputs"])  # no widget nobody can render
    assert "values [0, 10]" in _text(cells[2])


def test_papermill_fails_the_run_with_the_failing_ranks_error(tmp_path: Path, headless_env: dict[str, str]) -> None:
    source = _notebook(tmp_path / "in.ipynb", "%load_ext nbaccel", BAD, "print('never')")
    with pytest.raises(papermill.PapermillExecutionError) as raised:
        papermill.execute_notebook(str(source), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False, execution_timeout=int(scaled(120)))
    assert raised.value.ename == "RankFailedError" and "rank 1 failed: ValueError: rank 1 broke" in raised.value.evalue
    cells = [c for c in nbformat.read(tmp_path / "out.ipynb", as_version=4).cells if c["cell_type"] == "code"]  # papermill adds a banner above
    assert "[rank 1] before the error on rank 1" in _text(cells[1])  # the lines before the error are saved too
    assert "RankFailedError" in str(cells[1]["outputs"]) and "never" not in _text(cells[2])


def test_papermill_saves_a_small_notebook_for_a_loud_rank_and_every_line_in_its_log(tmp_path: Path, headless_env: dict[str, str]) -> None:
    source = _notebook(tmp_path / "in.ipynb", "%load_ext nbaccel", LOUD)
    papermill.execute_notebook(str(source), str(tmp_path / "out.ipynb"), kernel_name="python3", progress_bar=False, execution_timeout=int(scaled(150)))
    saved = (tmp_path / "out.ipynb").stat().st_size
    assert saved < 1_000_000, f"the saved notebook is {saved:,} bytes"  # 200,000 lines would be over 10 MB
    launch = _text(nbformat.read(tmp_path / "out.ipynb", as_version=4).cells[1])
    assert "nbaccel: rank 1: more than" in launch and "[rank 1] done 1" in launch and "[rank 0] done 0" in launch
    assert "[rank 1] loud line 0 " in launch and "[rank 1] loud line 199999 " not in launch.split("lines held back from the cell")[0]
    logs = list((tmp_path / "logs").glob("*/rank1.log"))
    assert len(logs) == 1 and f"{logs[0]}" in launch  # the notice names the file
    lines = logs[0].read_text().splitlines()
    assert len(lines) == 200_001 and lines[-2].startswith("loud line 199999 ") and lines[-1] == "done 1"


def _ipython(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", "--InteractiveShellApp.exec_lines=['%load_ext nbaccel']", "-c", code]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=scaled(120), check=False)


def test_terminal_ipython_shows_labelled_text(headless_env: dict[str, str]) -> None:
    done = _ipython(GOOD, headless_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "[rank 0] hello from rank 0" in lines and "[rank 1] hello from rank 1" in lines and "Out[0]: 0" in lines
    failed = _ipython(BAD, headless_env)
    assert failed.returncode == 1
    assert "[rank 1] before the error on rank 1" in failed.stdout
    assert "RankFailedError: rank 1 failed: ValueError: rank 1 broke" in failed.stdout + failed.stderr
