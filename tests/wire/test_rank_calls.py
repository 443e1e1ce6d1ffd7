"""Every call the kernel builds as data for the rank's own code names a rank function that takes it.

A ``RankCode`` names its function as a string (the kernel never imports the rank's module), so a
renamed function or a field the function does not take would only fail on a rank, mid-task. This
walks every ``RankCode`` subclass in nbaccel and checks the name and the keywords here.

Imports internals (wire.rank_calls): the contract between the kernel's data and the rank's code is
internal by nature; no public call shows a drift before a rank runs it.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
from pathlib import Path

import pytest

import nbaccel
from nbaccel.wire.rank_calls import RankCode, rank_function


def _all_rank_codes() -> list[type[RankCode]]:
    """Every RankCode subclass: the modules that name ``RankCode`` in a class statement, imported."""
    package = Path(nbaccel.__file__).parent
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(isinstance(node, ast.ClassDef) and any(ast.unparse(base) == "RankCode" for base in node.bases) for node in ast.walk(tree)):
            importlib.import_module(".".join(path.relative_to(package.parent).with_suffix("").parts))
    found: list[type[RankCode]] = []
    pending = list(RankCode.__subclasses__())
    while pending:
        cls = pending.pop()
        found.append(cls)
        pending.extend(cls.__subclasses__())
    return sorted(found, key=lambda cls: cls.__qualname__)


CODES = _all_rank_codes()


def test_the_walk_finds_the_calls_of_the_pool_and_the_launch() -> None:
    names = {cls.__name__ for cls in CODES}
    assert {"PostMortemOnError", "Profiled", "Fetch", "RankStatus", "FreeMemory", "GatherInto", "PlaceShards", "SaveCheckpoint"} <= names, names


@pytest.mark.parametrize("cls", CODES, ids=lambda cls: cls.__name__)
def test_each_call_names_a_rank_function_that_takes_its_fields_as_keywords(cls: type[RankCode]) -> None:
    assert dataclasses.is_dataclass(cls), f"{cls.__qualname__} must be a dataclass: its fields are the function's keywords"
    assert cls.__module__.split(".")[1] in ("wire", "pool"), f"{cls.__qualname__} is data both sides import: it lives in wire/ or pool/"
    function = rank_function(cls.code)
    assert function.__module__ == cls.code.partition(":")[0], f"{cls.code} is imported into its module, not defined there"
    parameters = inspect.signature(function).parameters
    keywords = {name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    fields = {field.name for field in dataclasses.fields(cls)}
    assert keywords == fields, f"{cls.code} takes the keywords {sorted(keywords)}; {cls.__qualname__} has the fields {sorted(fields)}"


def test_a_code_outside_the_rank_package_is_refused() -> None:
    with pytest.raises(ValueError, match="names no function of the rank's modules"):
        rank_function("os:system")
