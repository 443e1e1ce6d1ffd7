"""The stand-ins the magic tests use stay equal to what they stand for (contract tests).

Imports internals (notebook.magics): it tests those units directly, below the public face.
"""

from __future__ import annotations

import inspect

import pytest

import nbaccel
from nbaccel import WorkerPool
from nbaccel.notebook.magics import DistributedMagics, register
from tests.notebook.stand_ins import FakePool, Launches, Starts


def shape(function: object) -> list[tuple[str, object, object]]:
    """A signature without its annotations (the stand-ins do not repeat the real types)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(n for n, v in vars(FakePool).items() if callable(v) and not n.startswith("_")))
def test_every_method_of_the_fake_pool_takes_what_the_pools_method_takes(name: str) -> None:
    assert shape(getattr(FakePool, name)) == shape(getattr(WorkerPool, name))


@pytest.mark.parametrize("name", ["alive", "num_processes", "devices", "start_method"])
def test_what_the_fake_pool_holds_the_pool_holds_too(name: str) -> None:
    assert hasattr(FakePool(2), name)
    assert hasattr(WorkerPool, name) or name in WorkerPool.__init__.__code__.co_names  # a property, or set in __init__


def test_the_stand_in_launcher_and_starter_refuse_what_the_real_ones_refuse() -> None:
    with pytest.raises(TypeError, match="processes"):
        Launches()(lambda: 1, processes=2)  # notebook_launcher has num_processes, not processes
    with pytest.raises(TypeError, match="timeout"):
        Starts()(2, timeout=3)  # start_workers has start_timeout
    assert Launches()(lambda: 7, num_processes=2, cpu=True) == [7, "rank 1"]


def test_the_magics_use_nbaccels_launcher_and_pool_unless_given_others() -> None:
    for function in (DistributedMagics.__init__, register):
        parameters = inspect.signature(function).parameters
        assert parameters["launch"].default is nbaccel.notebook_launcher
        assert parameters["start_pool"].default is nbaccel.start_workers
