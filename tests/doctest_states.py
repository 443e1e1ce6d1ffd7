"""pytest plugin for the doctests of nbaccel/ (tests/test_static.py loads it with ``-p``).

A module's example may create the shared ``PartialState``/``AcceleratorState``/``GradientState``:
each example starts from none, as in a fresh kernel, and leaves none for the next one.

Example (what tests/test_static.py runs)::

    python -m pytest --doctest-modules nbaccel -p tests.conftest -p tests.doctest_states
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from nbaccel.testing import reset_all_states


@pytest.fixture(autouse=True)
def fresh_shared_states() -> Iterator[None]:
    """No shared state before an example, none after it."""
    reset_all_states()
    yield
    reset_all_states()
