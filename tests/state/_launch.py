"""The state tests' one seam to a launcher: ``nbaccel.notebook_launcher`` on CPU ranks over gloo.

Example::

    assert launch(lambda: PartialState().process_index, num_processes=2) == [0, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from nbaccel import notebook_launcher
from nbaccel.testing import scaled

TIMEOUT_S = 60.0  # on an idle machine; scaled on a loaded one


def launch(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2) -> list[Any]:
    """Every rank's value; a failing rank raises nbaccel.RankFailedError with its traceback."""
    return notebook_launcher(function, args=args, num_processes=num_processes, cpu=True, timeout=scaled(TIMEOUT_S), output="text")
