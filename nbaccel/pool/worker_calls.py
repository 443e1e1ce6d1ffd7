"""What the kernel asks a persistent worker to do: callables over the worker's namespace.

They are pickled by reference (this module is importable on every rank) around the user's own
objects, which cloudpickle carries by value when they were defined in the notebook.

Example:
    >>> namespace = {}
    >>> Assign({"x": 3})(namespace)
    >>> Fetch("x")(namespace)
    3
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nbaccel.rank import gather, shard_place


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
class Fetch:
    """A variable of the worker's namespace, with tensors moved to CPU (``%distributed pull``)."""

    name: str

    def __call__(self, namespace: dict[str, Any]) -> Any:
        if self.name not in namespace:
            raise NameError(f"name {self.name!r} is not defined on this rank; define it in a %%distributed cell first")
        value = namespace[self.name]
        if gather.holds_dtensors(value):  # a shard is not the value: every rank gathers it (nbaccel.pool.sharded)
            return gather.layout_of(value)
        return to_cpu(value)


def to_cpu(value: Any) -> Any:
    """Tensors (also inside dicts, lists and tuples) moved to CPU, so the kernel never touches CUDA."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return type(value)((k, to_cpu(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(to_cpu(v) for v in value)
    if torch is not None and isinstance(value, torch.nn.Module):
        return {k: v.detach().cpu() for k, v in value.state_dict().items()}
    return value


@dataclass
class RankStatus:
    """What only the rank knows about itself: its resident memory (it may run on another node) and GPU memory.

    On a GPU: ``device_memory_mb`` (allocated by tensors), ``device_reserved_mb`` (held by torch's
    caching allocator) and ``device_used_mb`` (the whole device's use, from ``cudaMemGetInfo``);
    ``shards``: for each sharded module, the bytes of parameters this rank holds and the full size.
    """

    def __call__(self, namespace: dict[str, Any]) -> dict[str, Any]:
        cuda = {f"{k}_mb": None if v is None else v / 2**20 for k, v in _cuda_memory().items()}
        return {"memory_mb": _resident_bytes() / 2**20, **cuda, "shards": shard_place.shard_sizes(namespace)}


@dataclass
class FreeMemory:
    """``%distributed free``: collect garbage, return torch's cached GPU memory and glibc's free heap.

    Returns what the rank held before and after: ``rss`` and, on a GPU, ``device_memory``,
    ``device_reserved``, ``device_used`` (bytes), and ``collected`` (objects the collector freed).
    """

    def __call__(self, namespace: dict[str, Any]) -> dict[str, Any]:
        import gc
        import sys

        before = {"rss": _resident_bytes(), **_cuda_memory()}
        collected = gc.collect()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
        _trim_heap()
        after = {"rss": _resident_bytes(), **_cuda_memory()}
        return {"before": before, "after": after, "collected": collected}


def _resident_bytes() -> int:
    import os

    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cuda_memory() -> dict[str, int | None]:
    """This rank's GPU memory in bytes, or Nones where it uses no CUDA (never initialises it)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {"device_memory": None, "device_reserved": None, "device_used": None}
    free, total = torch.cuda.mem_get_info()
    return {"device_memory": torch.cuda.memory_allocated(), "device_reserved": torch.cuda.memory_reserved(), "device_used": total - free}


def _trim_heap() -> None:
    """Hand freed heap pages back to the OS (glibc keeps them otherwise, and RSS would not drop)."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # the process's own symbols: glibc's, where it is glibc
    if trim is not None:
        trim(0)
