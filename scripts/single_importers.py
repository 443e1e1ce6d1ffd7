"""List nbaccel's modules that exactly one other module imports: the candidates for a merge review.

A module with one importer is either a concept of its own that happens to have one user (keep it)
or a fragment of its importer's concept split off (fold it back). This lists them, with the
importer and both sizes, so each can be decided by reading the pair; docs/architecture.md keeps the
decisions. Every ``import`` counts, wherever it stands (as ``tests/test_layers.py`` counts them);
tests, scripts and the lazy public face (``nbaccel/__init__.py``'s exports) are not importers.

Usage: ``python scripts/single_importers.py [PACKAGE ...]`` (default every package), e.g.
``python scripts/single_importers.py cluster output``.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.test_layers import all_imports, module_names  # one reading of the imports, the layer test's


def single_importers(packages: list[str]) -> list[tuple[str, str, int, int]]:
    """(module, its one importer, its lines, the importer's lines), for modules under ``packages``."""
    known = module_names()
    importers: dict[str, set[str]] = defaultdict(set)
    for found in all_imports():
        # the lazy public face imports everything it exports; a module's own package is no importer
        if found.importer != "nbaccel" and found.imported in known and found.imported != found.importer:
            importers[found.imported].add(found.importer)
    rows = []
    for module, path in known.items():
        inside = not packages or any(module.startswith(f"nbaccel.{p}.") for p in packages)
        if inside and path.name != "__init__.py" and len(importers[module]) == 1:
            [importer] = importers[module]
            rows.append((module, importer, _lines(path), _lines(known[importer])))
    return rows


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def main(argv: list[str]) -> None:
    rows = single_importers(argv)
    for module, importer, lines, importer_lines in rows:
        print(f"{module:45} {lines:4}  <- {importer} ({importer_lines})")
    print(f"{len(rows)} of {len(module_names())} modules have one importer")


if __name__ == "__main__":
    main(sys.argv[1:])
