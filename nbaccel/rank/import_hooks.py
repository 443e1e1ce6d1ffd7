"""Run a function right after a module is imported, or now if it already is (rank side).

A rank patches tqdm and IPython only if the user's code uses them; importing them eagerly in
every rank would cost a spawned rank a quarter of a second for nothing.

Example:
    >>> when_imported("json", lambda module: print(module.__name__))
    json
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

Hook = Callable[[ModuleType], None]

_lock = threading.RLock()
_pending: dict[str, list[Hook]] = {}


def when_imported(name: str, hook: Hook) -> None:
    """Call ``hook(module)`` once module ``name`` has been imported (now, if it already is)."""
    with _lock:
        module = sys.modules.get(name)
        if module is None:
            _pending.setdefault(name, []).append(hook)
            _ensure_finder()
            return
    _run(hook, module)


def _run(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # noqa: BLE001 - a failed patch must never fail the user's import
        print(f"nbaccel: could not hook into {module.__name__} ({type(exc).__name__}: {exc}); it works unpatched.", file=sys.stderr)


def _ensure_finder() -> None:
    # One finder, made at import (in the kernel, before the ranks fork), found by identity:
    # an isinstance() against this ABC would fill abc's caches in every forked rank.
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders return for a watched name."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _HookedLoader(spec.loader, fullname)
                return spec
        return None


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # Loaders keep state on the module spec (e.g. SourceFileLoader reads spec.loader back
        # through __loader__): give the real loader back before running the module.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        with _lock:
            hooks = _pending.pop(self._name, [])
        for hook in hooks:
            _run(hook, module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ...: the real loader's
        return getattr(self._loader, name)


_FINDER = _PostImportFinder()
