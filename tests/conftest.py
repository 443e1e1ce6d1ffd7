"""Shared fixtures: every test is bounded in time and must leave no child process behind."""

from __future__ import annotations

import os
import time

import psutil
import pytest

_SELF = psutil.Process()


def _children() -> dict[int, float]:
    """Live descendants of the test process, keyed by pid, with their create time."""
    found = {}
    for child in _SELF.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found[child.pid] = child.create_time()
        except psutil.NoSuchProcess:
            pass
    return found


@pytest.fixture(autouse=True)
def no_leaked_children(request: pytest.FixtureRequest):
    """Fail a test that leaves a process it started running (kernels held by wider fixtures are allowed)."""
    before = _children()
    yield
    deadline = time.monotonic() + 1.0
    leaked = {}
    while time.monotonic() < deadline:
        leaked = {pid: t for pid, t in _children().items() if before.get(pid) != t}
        if not leaked:
            return
        time.sleep(0.05)
    for pid in leaked:  # clean up so one leak does not cascade into every later test
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass
    pytest.fail(f"test left child processes running: {sorted(leaked)}", pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests where no CUDA device is visible."""
    try:
        import torch

        have_gpu = torch.cuda.device_count() > 0
    except Exception:  # torch missing or broken: GPU tier cannot run
        have_gpu = False
    if have_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("NBACCEL_OUTPUT", "text")
