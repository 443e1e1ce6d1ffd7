"""The test tree imports as one package (tests/__init__.py): every helper module and conftest loads once."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_test_module_is_loaded_under_two_names() -> None:
    names: defaultdict[str, list[str]] = defaultdict(list)
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(TESTS):
            names[str(Path(path).resolve().relative_to(TESTS))].append(name)
    twice = {path: found for path, found in names.items() if len(found) > 1}
    assert twice == {}
    assert names["conftest.py"] == ["tests.conftest"]  # not also as a top-level "conftest"
