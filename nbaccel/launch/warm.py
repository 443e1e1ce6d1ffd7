"""Heavy modules the ranks had to import: the kernel imports them once, so later forks inherit them.

DDP's first use in a rank imports ``torch._dynamo`` (about 800 modules, 1-4 s per rank on a
small machine), and a forked rank starts from the kernel's modules. When a rank reports that it
had to import one of the few modules on the allow-list, the kernel imports it after the launch
returns: the first DDP launch pays once, every later one starts warm. Only allow-listed modules
are ever imported in the kernel (an arbitrary module might initialise CUDA on import).

Example:
    >>> before = imported_by_rank(set())
    >>> sorted(before) == sorted(m for m in WARM_MODULES if m in sys.modules)
    True
"""

from __future__ import annotations

import importlib
import sys

WARM_MODULES = ("torch._dynamo",)

_noted: set[str] = set()


def present() -> set[str]:
    """The allow-listed modules this process has now (a rank records them when it starts)."""
    return {name for name in WARM_MODULES if name in sys.modules}


def imported_by_rank(at_start: set[str]) -> set[str]:
    """Allow-listed modules a rank imported since it started."""
    return present() - at_start


def note(modules: list[str]) -> None:
    """Kernel side: a rank reported these; import them after the launch."""
    _noted.update(m for m in modules if m in WARM_MODULES)


def import_noted() -> None:
    """Import what ranks reported and the kernel lacks (after the launch, never during it)."""
    for name in sorted(_noted - present()):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - warming is an optimisation: never fail a launch for it
            pass
    _noted.clear()
