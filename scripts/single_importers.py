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

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nbaccel"


def modules() -> dict[str, Path]:
    """Every module of nbaccel by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imported_by(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The nbaccel modules ``module`` imports (``from package import module`` names the module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            targets.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names)
    return {t for t in targets if t in known and t != module}


def single_importers(packages: list[str]) -> list[tuple[str, str, int, int]]:
    """(module, its one importer, its lines, the importer's lines), for modules under ``packages``."""
    known = modules()
    importers: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        if module == "nbaccel":
            continue  # the lazy public face imports everything it exports
        for target in imported_by(module, path, known):
            importers[target].add(module)
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
    print(f"{len(rows)} of {len(modules())} modules have one importer")


if __name__ == "__main__":
    main(sys.argv[1:])
