"""The documentation site builds with no warning, and documents every public name.

Sphinx builds docs/ (MyST pages, the API reference from the docstrings, the example notebooks as
saved, never executed) with warnings as errors, as CI does: a broken docstring, a dangling
toctree entry or a notebook that does not parse fails here.

Imports nbaccel.state: the reference must name every name of the state's own __all__ too.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import nbaccel
import nbaccel.state

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_nb")
    out = tmp_path_factory.mktemp("site")
    command = [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-q", "-b", "html", "-d", str(out / "doctrees"), "docs", str(out / "html")]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=220, check=False)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-8000:]
    return out / "html"


def test_the_site_builds_without_warnings(site: Path) -> None:
    assert (site / "index.html").is_file()
    for page in ("api", "architecture", "magic", "launcher", "output", "state", "workers", "multinode", "extension", "examples"):
        assert (site / f"{page}.html").is_file(), page


def test_every_public_name_has_an_entry_in_the_api_reference(site: Path) -> None:
    documented = set(re.findall(r'<dt class="sig sig-object py" id="([\w.]+)"', (site / "api.html").read_text()))
    public = {f"nbaccel.{name}" for name in nbaccel.__all__}
    state = {f"nbaccel.{name}" if name in nbaccel.__all__ else f"nbaccel.state.{name}" for name in nbaccel.state.__all__}
    missing = sorted((public | state) - documented)
    assert not missing, f"public names without an entry in docs/api.md: {missing}"


def test_every_example_notebook_is_on_the_site(site: Path) -> None:
    notebooks = sorted(p.stem for p in (ROOT / "examples").glob("*.ipynb"))
    assert notebooks, "no example notebooks found"
    for name in notebooks:
        page = site / "notebooks" / f"{name}.html"
        assert page.is_file(), name
        assert "nbaccel" in page.read_text(), name  # rendered from the notebook's cells
