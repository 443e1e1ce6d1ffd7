"""The JupyterLab extension's packaging: one version everywhere, the wheel holds the prebuilt
labextension and no Node build leftovers (scripts/check_dist.py does the checking)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import nbaccel

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / "nbaccel" / "labextension"
sys.path.insert(0, str(ROOT / "scripts"))
import check_dist  # noqa: E402 - scripts/ is no package: importable only once on sys.path


def _require_built() -> None:
    """Skip without a build, except where CI says the extension was built (then it must be)."""
    if not (BUILT / "static" / "style.js").exists():
        if os.environ.get("NBACCEL_REQUIRE_EXTENSION") == "1":
            pytest.fail(f"NBACCEL_REQUIRE_EXTENSION=1 but {BUILT} is not built; run scripts/build-extension.sh")
        pytest.skip(f"{BUILT} is not built (scripts/build-extension.sh builds it)")


def test_extension_version_is_nbaccels() -> None:
    package = json.loads((ROOT / "extension" / "package.json").read_text())
    assert package["version"] == nbaccel.__version__, (
        f"extension/package.json says {package['version']!r}, nbaccel/_version.py {nbaccel.__version__!r}: set both alike"
    )
    assert package["name"] == "nbaccel"


def test_install_json_names_the_python_package() -> None:
    install = json.loads((ROOT / "extension" / "install.json").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert install["packageManager"] == "python"
    assert install["packageName"] == project["project"]["name"] == "nbaccel"
    shared = project["tool"]["hatch"]["build"]["targets"]["wheel"]["shared-data"]
    assert shared["extension/install.json"] == "share/jupyter/labextensions/nbaccel/install.json"
    assert shared["nbaccel/labextension"] == "share/jupyter/labextensions/nbaccel"


def test_built_labextension_has_nbaccels_version() -> None:
    _require_built()
    built = json.loads((BUILT / "package.json").read_text())
    assert built["version"] == nbaccel.__version__, f"{BUILT} is stale ({built['version']!r}); rebuild it"


def test_checker_finds_node_leftovers_and_a_missing_labextension() -> None:
    names = ["nbaccel-0.1.0.data/data/share/jupyter/labextensions/nbaccel/node_modules/x/index.js", "nbaccel/__init__.py"]
    problems = check_dist.problems_in_names("wheel", names)
    assert any("package.json" in p for p in problems)
    assert any("Node build leftovers" in p for p in problems)
    sdist = ["nbaccel-0.1.0/extension/.yarn/cache/a.zip", "nbaccel-0.1.0/extension/package.json"]
    assert any(".yarn" in p for p in check_dist.problems_in_names("sdist", sdist))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_wheel_holds_the_labextension(tmp_path: Path) -> None:
    _require_built()
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)], check=True)
    (wheel,) = tmp_path.glob("nbaccel-*.whl")
    assert check_dist.check(wheel) == []
