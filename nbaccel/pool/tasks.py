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
        return to_cpu(namespace[self.name])


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
    """What only the rank knows about itself: its resident memory (it may run on another node) and GPU memory."""

    def __call__(self, namespace: dict[str, Any]) -> dict[str, Any]:
        import os
        import sys

        with open("/proc/self/statm") as statm:
            resident_mb = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"memory_mb": resident_mb, "device_memory_mb": None}
        return {"memory_mb": resident_mb, "device_memory_mb": torch.cuda.memory_allocated() / 2**20}
