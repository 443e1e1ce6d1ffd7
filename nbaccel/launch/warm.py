"""Heavy modules the ranks had to import: the kernel imports them once, so later forks inherit them.

DDP's first use in a rank imports ``torch._dynamo`` (about 800 modules, 1-4 s per rank on a
small machine), and a forked rank starts from the kernel's modules. When a rank reports that it
had to import one of the few modules on the allow-list, the kernel imports it after the launch
returns: the first DDP launch pays once, every later one starts warm. Only allow-listed modules
are ever imported in the kernel (an arbitrary module might initialise CUDA on import).

Example:
    >>> note(["os.path", "torch._dynamo"])  # only allow-listed names are kept
    >>> sorted(_noted)
    ['torch._dynamo']
    >>> _noted.clear()
"""

from __future__ import annotations

import importlib
import sys

from nbaccel.wire.events import WARM_MODULES

_noted: set[str] = set()


def note(modules: list[str]) -> None:
    """Kernel side: a rank reported these; import them after the launch."""
    _noted.update(m for m in modules if m in WARM_MODULES)


def import_noted() -> None:
    """Import what ranks reported and the kernel lacks (after the launch, never during it)."""
    # A lookup per noted name: ``_noted - sys.modules.keys()`` walks every module torch loaded (about 1 ms).
    for name in sorted(name for name in _noted if name not in sys.modules):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - warming is an optimisation: never fail a launch for it
            pass
    _noted.clear()
