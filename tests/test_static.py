"""The package stays typed and free of undefined names: mypy and ruff run as part of the suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(300)


def _run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *command], cwd=ROOT, capture_output=True, text=True, timeout=280)


def test_mypy_finds_no_type_errors() -> None:
    pytest.importorskip("mypy")
    run = _run("mypy")  # configured in pyproject.toml: files = nbaccel
    assert run.returncode == 0, run.stdout + run.stderr


def test_ruff_finds_no_undefined_or_unused_names() -> None:
    pytest.importorskip("ruff")
    run = _run("ruff", "check", "nbaccel", "--select", "F,E9")
    assert run.returncode == 0, run.stdout + run.stderr
