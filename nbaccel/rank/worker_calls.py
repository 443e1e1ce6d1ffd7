"""The rank's code of a persistent worker's calls: what each of ``nbaccel.pool.worker_calls`` and
``nbaccel.pool.sharded``'s calls runs, over the worker's namespace.

The kernel builds a call as data (a ``nbaccel.wire.rank_calls.RankCode`` dataclass naming one of
these functions) without importing this module; the rank imports it when it runs the call, and
the call's fields arrive as keyword arguments.

Example:
    >>> fetch({"x": [3]}, name="x")
    [3]
    >>> sorted(status({}))
    ['device_memory_mb', 'device_reserved_mb', 'device_used_mb', 'memory_mb', 'shards']
"""

from __future__ import annotations

import sys
from typing import Any

from nbaccel.rank import checkpoint, gather, shard_place
from nbaccel.wire.sharded import Layout, Refusal


def _value(namespace: dict[str, Any], name: str) -> Any:
    if name not in namespace:
        raise NameError(f"name {name!r} is not defined on this rank; define it in a %%distributed cell first")
    return namespace[name]


def fetch(namespace: dict[str, Any], *, name: str) -> Any:
    """A variable of the worker's namespace, with tensors moved to CPU (``%distributed pull``)."""
    value = _value(namespace, name)
    if gather.holds_dtensors(value):  # a shard is not the value: every rank gathers it (nbaccel.pool.sharded)
        return gather.layout_of(value)
    return to_cpu(value)


def to_cpu(value: Any) -> Any:
    """Tensors (also inside dicts, lists and tuples) moved to CPU, so the kernel never touches CUDA.

    >>> to_cpu({"a": (1, [2])})
    {'a': (1, [2])}
    """
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


def status(namespace: dict[str, Any]) -> dict[str, Any]:
    """What only the rank knows about itself (``nbaccel.pool.worker_calls.RankStatus``)."""
    cuda = {f"{k}_mb": None if v is None else v / 2**20 for k, v in _cuda_memory().items()}
    return {"memory_mb": _resident_bytes() / 2**20, **cuda, "shards": shard_place.shard_sizes(namespace)}


def free_memory(namespace: dict[str, Any]) -> dict[str, Any]:
    """``%distributed free``: collect garbage, return torch's cached GPU memory and glibc's free heap."""
    import gc

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


def gather_fetch(namespace: dict[str, Any], *, name: str, writer: int) -> Any:
    """Every rank gathers ``name``'s DTensors in step; rank ``writer`` answers the full value."""
    return gather.gather(_value(namespace, name), writer)


def gather_into(namespace: dict[str, Any], *, name: str, writer: int, region: Any, layout: Layout) -> Any:
    """Every rank writes its shards of ``name``'s tensors into ``region``; ``writer`` answers the rest."""
    return gather.gather_into(_value(namespace, name), writer, region, layout)


def place_shards(namespace: dict[str, Any], *, name: str, skeleton: Any, shards: dict[str, Any], buffers: dict[str, Any], mesh_shape: tuple[int, ...]) -> None:
    """Bind ``name`` to the module made of ``skeleton`` and this rank's ``shards``."""
    namespace[name] = shard_place.place(skeleton, shards, buffers, mesh_shape)


def place_with(
    namespace: dict[str, Any], *, name: str, skeleton: Any, recipe: Any, params: dict[str, Any], buffers: dict[str, Any], mesh_shape: tuple[int, ...]
) -> None:
    """Bind ``name`` to the module the user's ``recipe`` shards, each rank copying its own part of ``params``."""
    namespace[name] = shard_place.place_with(skeleton, recipe, params, buffers, mesh_shape)


def save_checkpoint(namespace: dict[str, Any], *, directory: str, names: list[str], partial: str) -> list[str] | Refusal:
    """``pool.save``: DCP into ``directory``, atomic (through ``partial``)."""
    return checkpoint.save(namespace, directory, names, partial)


def load_checkpoint(namespace: dict[str, Any], *, directory: str, names: list[str]) -> list[str] | Refusal:
    """``pool.load``: DCP from ``directory``, resharded onto these ranks."""
    return checkpoint.load(namespace, directory, names)
