"""Every state test starts from no shared state and no launch variables in the test process."""

from __future__ import annotations

import pytest

from nbaccel.state import reset_all_states

LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_USE_AGENT_STORE",
    "NBACCEL_FORK_LAUNCHED",
    "FORK_LAUNCHED",
    "NBACCEL_DEVICE_TYPE",
    "ACCELERATE_MIXED_PRECISION",
    "ACCELERATE_USE_CPU",
    "ACCELERATE_DEBUG_MODE",
)


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch):
    """A plain single process: no launch variables, no shared state before or after the test."""
    for name in LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    reset_all_states()
    yield
    reset_all_states()
