"""A launch's job as bytes: pickled once, loaded after pinning, captured CUDA tensors on the rank's device.

Imports internals (launch, wire, wire.job): it tests those units directly, below the public face.
"""

from __future__ import annotations

import pytest
import torch

import nbaccel
from nbaccel.launch.starters import fork_server
from nbaccel.testing import mark_fork_safe, mark_not_fork_safe
from nbaccel.wire import job_pickle
from nbaccel.wire.job import Job


@pytest.fixture
def pretend_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensors marked ``_on_gpu`` count as CUDA tensors (no GPU here); the rank rebuilds on its device (the CPU)."""
    monkeypatch.setattr(job_pickle, "is_gpu_tensor", lambda t: getattr(t, "_on_gpu", False))


def test_captured_gpu_tensors_travel_as_cpu_copies_and_are_named(pretend_gpu) -> None:
    weight = torch.nn.Parameter(torch.arange(6.0).reshape(2, 3))
    weight._on_gpu = True
    bias = torch.ones(3, requires_grad=True)
    bias._on_gpu = True
    noted: list[str] = []
    job = job_pickle.load_job(job_pickle.dump_job(Job(lambda: (weight, bias, weight)), noted))
    w, b, same = job.function()
    assert isinstance(w, torch.nn.Parameter) and w.requires_grad and torch.equal(w, weight)
    assert b.requires_grad and torch.equal(b, bias)
    assert same is w  # one object captured twice stays one (tied weights)
    assert sorted(noted) == ["float32[2, 3] on cpu, 0.0 MiB", "float32[3] on cpu, 0.0 MiB"]


def test_a_launch_through_the_server_names_captured_gpu_tensors_once(pretend_gpu, capsys) -> None:
    table = torch.arange(4.0)
    table._on_gpu = True
    fork_server.start_early()  # or, once this process's OpenMP pool started, auto starts an exec'd one
    mark_not_fork_safe("CUDA is initialised (pretend)")
    try:
        assert nbaccel.notebook_launcher(lambda: table.sum().item(), num_processes=2) == [6.0, 6.0]
    finally:
        mark_fork_safe()
        fork_server.shutdown()
    out = capsys.readouterr().out
    assert out.count("the function holds 1 CUDA tensor(s) (float32[4] on cpu, 0.0 MiB); each rank gets a copy on its own GPU") == 1
