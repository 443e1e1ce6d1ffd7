"""The kernel tier's one real kernel per module, and what each module may say about it.

`kernel` is a real ipykernel (tests/kernel_harness.py) shared by a module's tests. A module sets
its environment by overriding the `kernel_env` fixture and the code it starts with by
overriding `kernel_setup` (both module-scoped), e.g.::

    @pytest.fixture(scope="module")
    def kernel_setup() -> str:
        return "%load_ext nbaccel"

A test that must end its kernel (kill, restart, shut down) starts its own with `running_kernel`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.kernel_harness import Kernel, running_kernel


@pytest.fixture(scope="module")
def kernel_env() -> dict[str, str]:
    """Variables added to the module kernel's environment (default: text output)."""
    return {"NBACCEL_OUTPUT": "text"}


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    """Code the module kernel runs before the module's first test (default: none)."""
    return ""


@pytest.fixture(scope="module")
def kernel(kernel_env: dict[str, str], kernel_setup: str) -> Iterator[Kernel]:
    """One real kernel for the module's tests, shut down (and reaped) after the last one."""
    with running_kernel(env=kernel_env) as started:
        if kernel_setup:
            setup = started.execute(kernel_setup)
            assert setup.status == "ok", (setup.error, setup.stderr)
        yield started
