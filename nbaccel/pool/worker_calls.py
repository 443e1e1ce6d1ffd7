"""What the kernel asks a persistent worker to do: callables over the worker's namespace.

They are pickled by reference (this module is importable on every rank) around the user's own
objects, which cloudpickle carries by value when they were defined in the notebook. A call whose
code is the rank's own (``Fetch``, ``RankStatus``, ``FreeMemory``) is data here: a
``RankCode`` naming its function in ``nbaccel.rank.worker_calls``, which only the rank imports.

Example:
    >>> namespace = {}
    >>> Assign({"x": 3})(namespace)
    >>> Fetch("x")(namespace)
    3
    >>> Fetch("x").code
    'nbaccel.rank.worker_calls:fetch'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from nbaccel.wire.rank_calls import RankCode


@dataclass
class CallFunction:
    """``function(*args)``, as ``pool.run(function, *args)`` asks."""

    function: Callable[..., Any]
    args: tuple[Any, ...]

    def __call__(self, namespace: dict[str, Any]) -> Any:
        return self.function(*self.args)


@dataclass
class Assign:
    """Bind names in the worker's namespace (``%distributed push``)."""

    values: dict[str, Any]

    def __call__(self, namespace: dict[str, Any]) -> None:
        namespace.update(self.values)


@dataclass
class Fetch(RankCode):
    """A variable of the worker's namespace, with tensors moved to CPU (``%distributed pull``); a
    value holding DTensors answers its layout instead (``nbaccel.pool.sharded.pull`` gathers it)."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:fetch"
    name: str


@dataclass
class RankStatus(RankCode):
    """What only the rank knows about itself: its resident memory (it may run on another node) and GPU memory.

    On a GPU: ``device_memory_mb`` (allocated by tensors), ``device_reserved_mb`` (held by torch's
    caching allocator) and ``device_used_mb`` (the whole device's use, from ``cudaMemGetInfo``);
    ``shards``: for each sharded module, the bytes of parameters this rank holds and the full size.
    """

    code: ClassVar[str] = "nbaccel.rank.worker_calls:status"


@dataclass
class FreeMemory(RankCode):
    """``%distributed free``: collect garbage, return torch's cached GPU memory and glibc's free heap.

    Returns what the rank held before and after: ``rss`` and, on a GPU, ``device_memory``,
    ``device_reserved``, ``device_used`` (bytes), and ``collected`` (objects the collector freed).
    """

    code: ClassVar[str] = "nbaccel.rank.worker_calls:free_memory"
