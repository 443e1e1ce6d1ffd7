"""Functions that travel by value (cloudpickle) and still show their source in tracebacks.

cloudpickle replaces every code object's file name with ``<dynamic-code>`` (to make payloads
deterministic), so a traceback raised on a spawned rank or a persistent worker would lose the
notebook cell's lines. ``Sourced`` carries the file name and the cached source beside the
function, and puts both back when it is unpickled.

Example:
    >>> import cloudpickle, pickle
    >>> wrapped = Sourced.wrap(lambda: 1)
    >>> fn = pickle.loads(cloudpickle.dumps(wrapped))
    >>> fn(), fn.function.__code__.co_filename == wrapped.filename != "<dynamic-code>"
    (1, True)
"""

from __future__ import annotations

import linecache
import types
from collections.abc import Callable
from typing import Any


class Sourced:
    """A callable wrapper that restores its function's file name and linecache entry on unpickling."""

    def __init__(self, function: Callable[..., Any], filename: str, source: tuple[Any, ...] | None) -> None:
        self.function = function
        self.filename = filename
        self.source = source

    @classmethod
    def wrap(cls, function: Callable[..., Any]) -> Callable[..., Any]:
        """``function`` wrapped when it is a plain Python function; anything else as it is."""
        code = getattr(function, "__code__", None)
        if not isinstance(function, types.FunctionType) or code is None:
            return function
        entry = linecache.cache.get(code.co_filename)
        return cls(function, code.co_filename, tuple(entry) if entry is not None else None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if isinstance(self.function, types.FunctionType):
            self.function.__code__ = _renamed(self.function.__code__, self.filename)
        if self.source is not None and self.filename not in linecache.cache:
            linecache.cache[self.filename] = self.source

    def __repr__(self) -> str:
        return f"Sourced({self.function!r})"


def _renamed(code: types.CodeType, filename: str) -> types.CodeType:
    """``code`` and every code object nested in it (inner functions, comprehensions), renamed."""
    consts = tuple(_renamed(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)
