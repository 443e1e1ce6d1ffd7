"""The package stays typed, lint-clean and true to its examples: mypy, ruff and the doctests run as part of the suite."""

from __future__ import annotations

import ast
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


# What tests of behaviour may import: the public face. nbaccel.state is public too (its
# exceptions and reset_all_states are in the API reference).
PUBLIC_MODULES = {"nbaccel", "nbaccel.testing", "nbaccel.state"}
PUBLIC_NAMES = {"notebook_launcher", "start_workers", "accumulate", "prepare_data_loader", "testing", "load_ipython_extension", "unload_ipython_extension"}


def _internal_imports(tree: ast.Module) -> set[str]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "nbaccel":  # `from nbaccel import launch`: a module, not a public name
                found |= {f"nbaccel.{a.name}" for a in node.names if a.name[0].islower() and a.name not in PUBLIC_NAMES}
            elif node.module.startswith("nbaccel.") and node.module not in PUBLIC_MODULES:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("nbaccel.") and a.name not in PUBLIC_MODULES}
    return found


def test_a_test_that_reaches_inside_says_why() -> None:
    """Tests stand on the public face; a test module importing an internal one says so, and why,
    in its docstring (the word "internal")."""
    silent = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        inside = _internal_imports(tree)
        if inside and "internal" not in (ast.get_docstring(tree) or ""):
            silent[str(path.relative_to(ROOT))] = sorted(inside)
    assert not silent, f"test modules importing internals without saying why in their docstring: {silent}"
