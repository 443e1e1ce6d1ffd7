"""Check nbaccel's wheel and sdist: the prebuilt labextension inside, no Node build leftovers.

    python scripts/check_dist.py dist/nbaccel-0.1.0-py3-none-any.whl dist/nbaccel-0.1.0.tar.gz

Exits 1 and lists every problem found (tests/test_packaging.py calls the same functions).

Example:
    >>> problems_in_names("wheel", ["nbaccel/__init__.py"])[:1]
    ['wheel: no share/jupyter/labextensions/nbaccel/package.json (the prebuilt JupyterLab extension); build it with scripts/build-extension.sh first']
"""

from __future__ import annotations

import json
import sys
import tarfile
import zipfile
from pathlib import Path

SHARE = "share/jupyter/labextensions/nbaccel/"
NEEDED_IN_WHEEL = ("package.json", "install.json", "static/style.js")
NEVER = ("node_modules/", "/.yarn/", "extension/lib/", ".tsbuildinfo")
MAX_SDIST_BYTES = 2_000_000  # an unignored .yarn/ cache made a 116 MB sdist in a trial


def problems_in_names(kind: str, names: list[str]) -> list[str]:
    """What is wrong with a distribution holding ``names`` (paths inside the archive)."""
    problems = []
    if kind == "wheel":
        shared = {n.split(".data/data/", 1)[1] for n in names if ".data/data/" in n}
        for needed in NEEDED_IN_WHEEL:
            if SHARE + needed not in shared:
                why = " (the prebuilt JupyterLab extension); build it with scripts/build-extension.sh first"
                problems.append(f"wheel: no {SHARE}{needed}{why if needed == 'package.json' else ''}")
        if not any(n.startswith(SHARE + "static/remoteEntry.") for n in shared):
            problems.append(f"wheel: no {SHARE}static/remoteEntry.*.js: the labextension was not built by jupyter-builder")
    else:
        if not any(n.endswith("/nbaccel/labextension/static/style.js") for n in names):
            problems.append("sdist: no nbaccel/labextension/static/style.js: a wheel built from it would need Node")
        if not any(n.endswith("/extension/package.json") for n in names):
            problems.append("sdist: no extension/package.json: the extension's sources are missing")
    leftovers = sorted({n for n in names for bad in NEVER if bad in n})
    if leftovers:
        problems.append(f"{kind}: holds Node build leftovers, e.g. {leftovers[:3]!r}; they must stay git-ignored and excluded")
    return problems


def check(path: Path) -> list[str]:
    """Problems of the wheel or sdist at ``path`` (names, size, versions)."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            problems = problems_in_names("wheel", names)
            package = next((n for n in names if n.endswith(f".data/data/{SHARE}package.json")), None)
            if package is not None:
                problems += _version_problems(path, json.loads(archive.read(package)))
        return problems
    with tarfile.open(path) as archive:
        problems = problems_in_names("sdist", archive.getnames())
    size = path.stat().st_size
    if size > MAX_SDIST_BYTES:
        problems.append(f"sdist: {size:,} bytes, over {MAX_SDIST_BYTES:,}: something unignored (node_modules, .yarn) got in")
    return problems


def _version_problems(path: Path, package: dict[str, object]) -> list[str]:
    wheel_version = path.name.split("-")[1]
    if package.get("version") != wheel_version:
        found = package.get("version")
        return [
            f"wheel {path.name}: its labextension is version {found!r}, the wheel {wheel_version!r}; set extension/package.json's version to nbaccel/_version.py's and rebuild"
        ]
    return []


def main(paths: list[str]) -> int:
    problems = [problem for path in paths for problem in check(Path(path))]
    for problem in problems:
        print(f"check_dist: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_dist: {', '.join(Path(p).name for p in paths)}: labextension inside, no Node leftovers")
    return 1 if problems or not paths else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
