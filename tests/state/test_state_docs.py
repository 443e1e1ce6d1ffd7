"""Every example in the state modules' docstrings runs as written (one process).

Imports internals (state): it tests those units directly, below the public face.
"""

from __future__ import annotations

import doctest
import importlib
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader

import nbaccel
from nbaccel.state import reset_all_states

MODULES = (
    "nbaccel.state.split",
    "nbaccel.state.plugins",
    "nbaccel.state.launch_env",
    "nbaccel.state.default_group",
    "nbaccel.state.control",
    "nbaccel.state.partial",
    "nbaccel.state.accelerator",
    "nbaccel.state.gradient",
    "nbaccel.state",
    "nbaccel.state.data",
)


def examples(module_name: str) -> list[doctest.DocTest]:
    module = importlib.import_module(module_name)
    names = {name: getattr(nbaccel, name) for name in nbaccel.__all__ if name != "notebook_launcher"}
    names.update(torch=torch, timedelta=timedelta, DataLoader=DataLoader)
    tests = doctest.DocTestFinder(exclude_empty=True).find(module, module_name, extraglobs=names)
    return [t for t in tests if t.examples]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    found = examples(module_name)
    assert found, f"{module_name} has no examples"
    for test in found:
        reset_all_states()  # each docstring starts from a fresh process state, as in a new kernel
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) failed in {module_name} (see the output above)"
