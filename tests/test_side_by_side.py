"""The benchmarks' ``--against``: which checkout, the order of the turns, and how rounds are pooled and compared.

Unit tests of the scripts' own arithmetic (no kernel): the measurements themselves run in
``benchmarks/launch_bench.py`` and ``benchmarks/pool_bench.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import side_by_side from beside them
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


side_by_side = _script("side_by_side")
launch_bench = _script("launch_bench")
pool_bench = _script("pool_bench")


def test_against_names_a_checkout_or_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"holding nbaccel/__init__.py.*git worktree add"):
        side_by_side.checkout(str(tmp_path))
    (tmp_path / "nbaccel").mkdir()
    (tmp_path / "nbaccel" / "__init__.py").write_text("")
    assert side_by_side.checkout(str(tmp_path)) == str(tmp_path.resolve())
    assert side_by_side.trees(None) == {"new": side_by_side.HERE}
    assert side_by_side.trees(str(tmp_path)) == {"new": side_by_side.HERE, "old": str(tmp_path)}


def test_the_trees_take_turns_first() -> None:
    assert [side_by_side.turns(i, ["new", "old"]) for i in range(3)] == [["new", "old"], ["old", "new"], ["new", "old"]]


def test_rounds_are_pooled_before_their_median() -> None:
    rounds = [
        {"trivial": {"1": [10.0, 30.0]}, "fork_floor": {"1": [5.0]}, "all_reduce": {}, "mp_all_reduce": {}, "accelerate": {}, "phases": {"1": [{"loop": 1.0}]}},
        {
            "trivial": {"1": [20.0]},
            "fork_floor": {"1": [7.0, 6.0]},
            "all_reduce": {},
            "mp_all_reduce": {},
            "accelerate": {},
            "phases": {"1": [{"loop": 3.0, "fork": 2.0}]},
        },
    ]
    merged = launch_bench.merged(rounds)
    assert merged["trivial"] == {"1": 20.0} and merged["fork_floor"] == {"1": 6.0}
    assert merged["phases"] == {"1": {"loop": 2.0, "fork": 1.0}}  # a phase one tree's round lacks counts 0 there


def test_the_comparison_gives_new_over_old_with_each_trees_own_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    tree = {
        "trivial": {"2": 30.0},
        "fork_floor": {"2": 20.0},
        "all_reduce": {"2": 60.0},
        "mp_all_reduce": {"2": 50.0},
        "phases": {"2": {"loop": 4.0}},
        "uss_rank_mb": 5.0,
        "uss_fork_mb": 2.0,
    }
    old = {**tree, "trivial": {"2": 40.0}, "phases": {"2": {"loop": 8.0}}}
    rows = dict(launch_bench.comparison(tree, old))
    assert rows["  trivial / raw fork, 2 ranks (x)"] == {"new": 1.5, "old": 2.0}
    assert rows["phase loop, 2 ranks"] == {"new": 4.0, "old": 8.0}
    side_by_side.compare(list(rows.items()))
    printed = capsys.readouterr().out
    assert "trivial launch, 2 ranks" in printed and "   0.75" in printed and "1.50x" in printed


def test_the_pool_comparison_keeps_each_cell_beside_the_local_pass() -> None:
    figures = {
        "pool 2": {"local": 4.0, "trivial": 6.0, "all_reduce": 8.0},
        "one-shot 2": {"local": 4.0, "trivial": 40.0, "all_reduce": 80.0},
        "start 2": (1.0, 50.0, 45.0),
        "kernel cpu 2": {"local": 0.1, "trivial": 0.7},
    }
    old = {**figures, "pool 2": {"local": 4.0, "trivial": 8.0, "all_reduce": 8.0}}
    rows = dict(pool_bench.comparison(figures, old, (2,)))
    assert rows["pool 2 ranks: trivial"] == {"new": 6.0, "old": 8.0}
    assert rows["  pool 2 ranks: trivial / local pass (x)"] == {"new": 1.5, "old": 2.0}
    assert rows["  one-shot 2 ranks: trivial / local pass (x)"] == {"new": 10.0, "old": 10.0}
    assert rows["start -n 2: round trip"] == {"new": 50.0, "old": 50.0}
    assert rows["kernel CPU per trivial cell, 2 workers"] == {"new": 0.7, "old": 0.7}
