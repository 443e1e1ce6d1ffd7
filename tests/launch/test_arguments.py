"""Bad input is refused with a clear error before anything forks.

Imports nbaccel.launch.plan (internal): the tests patch what the plan sees of the machine.
"""

from __future__ import annotations

import os

import pytest

import nbaccel
import nbaccel.launch.plan as plan_module
from nbaccel.devices.inventory import Device, Inventory


def noop() -> None:
    return None


@pytest.fixture(autouse=True)
def forbid_forking(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> int:
        raise AssertionError("the launcher forked although the arguments were invalid")

    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", lambda *a, **k: refuse())


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"function": 42}, TypeError, "function must be callable, got 42"),
        ({"args": 3}, TypeError, r"args must be a tuple or list.*args=\(x,\)"),
        ({"args": "ab"}, TypeError, "args must be a tuple or list"),
        ({"num_processes": 0}, ValueError, "num_processes must be a whole number >= 1, got 0"),
        ({"num_processes": -2}, ValueError, "got -2"),
        ({"num_processes": 1.5}, ValueError, "got 1.5"),
        ({"num_processes": True}, ValueError, "got True"),
        ({"mixed_precision": "fp32"}, ValueError, r"unknown mixed_precision 'fp32'; choose one of 'no', 'fp16', 'bf16', 'fp8'"),
        ({"start_method": "forkserver2"}, ValueError, r"unknown start_method 'forkserver2'"),
        ({"timeout": 0}, ValueError, "timeout must be a positive number"),
        ({"timeout": -1.0}, ValueError, "timeout must be a positive number"),
        ({"max_restarts": -1}, ValueError, "max_restarts must be a whole number >= 0"),
        ({"master_addr": "0.0.0.0"}, ValueError, "not a loopback address"),
        ({"master_addr": "10.1.2.3"}, ValueError, "not a loopback address"),
        ({"use_port": "http"}, ValueError, "use_port must be a port number, got 'http'"),
        ({"use_port": 70000}, ValueError, "between 1 and 65535"),
        ({"mixed_precision": "fp8", "cpu": True}, ValueError, "fp8"),
        ({"gpus": [0], "cpu": True}, ValueError, "contradict"),
        ({"output": "html"}, ValueError, "unknown output 'html'"),
    ],
)
def test_bad_arguments_are_refused_before_forking(kwargs: dict, error: type, match: str) -> None:
    call = {"function": noop, **kwargs}
    with pytest.raises(error, match=match):
        nbaccel.notebook_launcher(**call)


def nvidia_gpus(count: int) -> Inventory:
    return Inventory("cuda", "nvidia", tuple(Device(i, "NVIDIA H200", i) for i in range(count)))


def test_gpus_that_are_not_visible_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "gpu_inventory", lambda: nvidia_gpus(2))
    with pytest.raises(ValueError, match=r"gpus=\[0, 3\] names device\(s\) \[3\], but only 2 GPU\(s\) are visible"):
        nbaccel.notebook_launcher(noop, gpus=[0, 3])
    with pytest.raises(ValueError, match="names a device twice"):
        nbaccel.notebook_launcher(noop, gpus=[1, 1])
    with pytest.raises(ValueError, match=r"num_processes=3 but gpus=\[0, 1\] names 2"):
        nbaccel.notebook_launcher(noop, num_processes=3, gpus=[0, 1])


def test_more_processes_than_gpus_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "gpu_inventory", lambda: nvidia_gpus(4))
    with pytest.raises(ValueError, match=r"num_processes=8 but only 4 GPU\(s\) are visible.*cpu=True"):
        nbaccel.notebook_launcher(noop, num_processes=8)


def test_fork_refused_with_cause_and_fix_when_cuda_is_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    hazard = "CUDA is already initialised in this kernel (a tensor was put on a GPU)"
    monkeypatch.setattr(plan_module, "fork_hazards", lambda: [hazard])
    with pytest.raises(nbaccel.PreflightError, match=r"cannot fork the ranks: CUDA is already initialised.*Restart the kernel.*start_method='spawn'"):
        nbaccel.notebook_launcher(noop, num_processes=2, start_method="fork")


def test_unknown_output_mode_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NBACCEL_OUTPUT", "fancy")
    with pytest.raises(ValueError, match="unknown NBACCEL_OUTPUT 'fancy'"):
        nbaccel.notebook_launcher(noop, num_processes=1)


def test_cluster_must_be_a_cluster_and_says_how_to_make_one() -> None:
    for call in (lambda: nbaccel.notebook_launcher(lambda: 1, cluster="10.0.0.1:29400"), lambda: nbaccel.start_workers(cluster="10.0.0.1:29400")):
        with pytest.raises(TypeError, match=r"cluster must be an nbaccel\.Cluster, got '10\.0\.0\.1:29400'; make one with nbaccel\.Cluster\('HOST:PORT'\)"):
            call()
