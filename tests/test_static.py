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


def test_ruff_finds_no_undefined_or_unused_names() -> None:
    """The whole of ruff's rule set as pyproject.toml configures it, not only undefined and unused names."""
    pytest.importorskip("ruff")
    run = _run("ruff", "check", "nbaccel")
    assert run.returncode == 0, run.stdout + run.stderr


def test_docstring_examples_run() -> None:
    """Every ``>>>`` example in nbaccel/ runs and shows what it says (``# doctest: +SKIP`` only where
    it needs an IPython shell). A pytest of its own: this suite's leak check (tests.conftest, loaded
    as a plugin) and fresh shared states (tests.doctest_states) apply to each example there."""
    run = _run("pytest", "--doctest-modules", "nbaccel", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", "-p", "tests.doctest_states")
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr
    assert " passed" in run.stdout, run.stdout[-2000:]
