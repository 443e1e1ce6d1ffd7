"""``LazyPartialState``: a real ``PartialState`` that sets the shared state up on first use.

``PartialState()`` joins (or creates) the process group when it is made. The ``state`` that a
``%%distributed`` cell (and every persistent worker's namespace) has predefined must not: a
cell that never touches it, or that creates its own group first, pays for no group. So this
subclass makes nothing when it is made, and sets up the shared state the first time one of
its attributes is read; from then on it is a view of that state like any ``PartialState``, so
``isinstance(state, PartialState)`` holds and Accelerate-style code sees what it expects.

Unlike a plain ``PartialState`` it outlives a reset (``PartialState._reset_state()``, or a fork
that drops the kernel's state): the next read sets the shared state up again.

Example (from a fresh process state, as in a new kernel):
    >>> PartialState._reset_state()
    >>> state = LazyPartialState()
    >>> isinstance(state, PartialState), state.initialized  # nothing set up yet
    (True, False)
    >>> state.num_processes, state.initialized
    (1, True)
"""

from __future__ import annotations

from nbaccel.state.partial import PartialState, _Snapshot

__all__ = ["LazyPartialState"]


class LazyPartialState(PartialState):
    """``PartialState()``, set up (process group included) when an attribute is first read."""

    def __init__(self) -> None:  # deliberately nothing: no group until first use
        pass

    @property
    def _state(self) -> _Snapshot:
        if PartialState._shared is None:
            PartialState.__init__(self)  # the first use: read the environment, join the group
        return super()._state

    def __repr__(self) -> str:
        if PartialState._shared is None:
            return "<state: nbaccel.PartialState, set up on first use>"  # showing it must not create a group
        return super().__repr__()

    def __reduce__(self) -> tuple[type[LazyPartialState], tuple[()]]:
        return (LazyPartialState, ())  # a copy on another process sets that process's state up there
