"""The process-state API: ``PartialState``, ``AcceleratorState``, ``GradientState`` and their helpers.

Each class lives in its own module; this one gathers them under Accelerate's module name
(``accelerate.state`` → ``nbaccel.state``) and offers `reset_all_states`.

Example:
    >>> from nbaccel.state import PartialState
    >>> state = PartialState()
    >>> state.print(f"process {state.process_index} of {state.num_processes}")
    process 0 of 1
"""

from __future__ import annotations

from nbaccel.state.accelerator import AcceleratorState, PluginNotFoundError
from nbaccel.state.control import FirstProcessFailedError
from nbaccel.state.gradient import GradientState
from nbaccel.state.partial import DistributedType, PartialState, StateResetError
from nbaccel.state.plugins import GradientAccumulationPlugin, InitProcessGroupKwargs

__all__ = [
    "AcceleratorState",
    "DistributedType",
    "FirstProcessFailedError",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "PartialState",
    "PluginNotFoundError",
    "StateResetError",
    "reset_all_states",
]


def reset_all_states() -> None:
    """Forget the shared ``PartialState``, ``AcceleratorState`` and ``GradientState``.

    nbaccel's worker calls this right after the fork, so a state created in the kernel never
    leaks into a rank; tests call it between cases. The process group is left alone.

    Example:
        >>> reset_all_states()
        >>> PartialState().num_processes
        1
    """
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
