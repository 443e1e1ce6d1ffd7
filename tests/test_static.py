"""The package stays typed, lint-clean and true to its examples: mypy, ruff and the doctests run as part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, check=False, capture_output=True, text=True, timeout=280)


def test_mypy_finds_no_type_errors() -> None:
    pytest.importorskip("mypy")
    run = _run("mypy")  # configured in pyproject.toml: files = nbaccel, strict = true
    assert run.returncode == 0, run.stdout + run.stderr


LINTED = ("nbaccel", "tests", "benchmarks", "examples", "scripts", "docs")


def test_ruff_check_is_clean() -> None:
    """The rule set pyproject.toml selects (pyflakes, pycodestyle, isort, bugbear, pyupgrade, simplify, blind
    excepts, unused noqa), over the package, its tests, benchmarks, examples and scripts."""
    pytest.importorskip("ruff")
    run = _run("ruff", "check", *LINTED)
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_format_leaves_nothing_to_change() -> None:
    pytest.importorskip("ruff")
    run = _run("ruff", "format", "--check", *LINTED)
    assert run.returncode == 0, run.stdout + run.stderr


def test_docstring_examples_run() -> None:
    """Every ``>>>`` example in nbaccel/ runs and shows what it says (``# doctest: +SKIP`` only where
    it needs an IPython shell), as a plain ``pytest --doctest-modules nbaccel`` runs them: in one
    process, in file order, so each example sets up the state it needs. A pytest of its own, with this
    suite's leak check (tests.conftest, loaded as a plugin) applied to each example."""
    run = _run("pytest", "--doctest-modules", "nbaccel", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest")
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr
    assert " passed" in run.stdout, run.stdout[-2000:]


def _layer_rows(text: str) -> dict[str, str]:
    """The rows of docs/architecture.md's layer table: folder ('agent', ... or '' for root) -> its text."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `nbaccel/"):
            rows[line.split("`")[1].removeprefix("nbaccel/").strip("/")] = line
        elif line.startswith("| root |"):
            rows[""] = line
    return rows


def test_the_architecture_map_names_every_module() -> None:
    """Every file of the package is on docs/architecture.md's map, in its own layer's row, by name.

    A subpackage's ``__init__.py`` is only its marker (the layer's row is the folder itself);
    the built JupyterLab extension is not source.
    """
    rows = _layer_rows((ROOT / "docs" / "architecture.md").read_text())
    package = ROOT / "nbaccel"
    missing = []
    for path in sorted(package.rglob("*")):
        relative = path.relative_to(package)
        if not path.is_file() or relative.parts[0] in ("labextension", "__pycache__") or path.suffix not in (".py", ".json") or "__pycache__" in relative.parts:
            continue
        if path.name == "__init__.py" and len(relative.parts) > 1:
            continue
        layer = relative.parts[0] if len(relative.parts) > 1 else ""
        if f"`{path.name}`" not in rows.get(layer, "") and f"`{relative.relative_to(layer) if layer else relative}`" not in rows.get(layer, ""):
            missing.append(str(relative))
    assert not missing, f"not on docs/architecture.md's map (add each to its layer's row): {missing}"
