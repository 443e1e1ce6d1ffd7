"""Sphinx configuration of nbaccel's documentation site.

Built with ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (tests/test_docs.py
runs that, warnings as errors). The pages are the Markdown files of docs/ (MyST), the API
reference comes from the docstrings (autodoc, Google style through napoleon), and the example
notebooks are shown with the outputs they were saved with (myst-nb, never executed here).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))  # the nbaccel of this checkout, not an installed one

from nbaccel import __version__  # noqa: E402 - importable only once ROOT is on sys.path

project = "nbaccel"
author = "The nbaccel authors"
copyright = "2026, The nbaccel authors"  # Sphinx's name for it (shadows the builtin, here only)
release = version = __version__

extensions = ["myst_nb", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
nb_execution_mode = "off"  # notebooks show their saved outputs: no kernel, no ranks at build time
nb_merge_streams = True

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True  # an "Attributes:" section is a field list: the properties are documented by autodoc once

html_theme = "furo"
html_title = f"nbaccel {release}"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store"]
suppress_warnings = ["myst.header"]  # pages start at ## under their one # title, as on GitHub


def _copy_notebooks() -> None:
    """The example notebooks live in examples/ (run there by the test suite); the site shows copies."""
    target = DOCS / "notebooks"
    target.mkdir(exist_ok=True)
    for notebook in sorted((ROOT / "examples").glob("*.ipynb")):
        shutil.copyfile(notebook, target / notebook.name)


_copy_notebooks()
