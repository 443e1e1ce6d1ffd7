"""A forked rank stops looking like the interactive kernel it was copied from (rank side).

Libraries decide how to behave by looking at the process: ``hasattr(sys, "ps1")`` means "an
interactive prompt" (Lightning then refuses ``strategy="ddp"``), ``get_ipython()`` answering
means "a notebook" (tqdm.autonotebook, rich, trackers pick widgets the rank cannot show). A
rank that torchrun starts has none of that, so a rank forked from the kernel drops it:

  - ``sys.ps1`` / ``sys.ps2``, which only an interactive interpreter (or ipykernel) sets;
  - ``get_ipython``: the builtin, the one in ``__main__`` (the notebook's namespace), and IPython's
    own ``IPython.get_ipython()``, which answers None. IPython's shell object itself stays, so
    ``display()`` keeps formatting and reaches the kernel through nbaccel's publisher
    (``display_hooks``); only the question "am I in IPython?" gets torchrun's answer;
  - ``__IPYTHON__`` in builtins (the flag ``try: __IPYTHON__`` tests), and IPython's ``exit`` /
    ``quit``, which in a rank would only ask a shell that is not there to stop: they become
    Python's own, which raise SystemExit as under torchrun;
  - flags a library computed at import in the kernel: Lightning's ``_IS_INTERACTIVE`` (copied
    into several of its modules) is computed again.

Example (what ``run_rank`` does in every rank)::

    become_rank()
    assert not hasattr(sys, "ps1")
"""

from __future__ import annotations

import _sitebuiltins
import builtins
import os
import sys
from types import ModuleType
from typing import Any

from nbaccel.rank.import_hooks import when_imported

# Where Lightning keeps a copy of the flag it computes once, at import (lightning 2.x):
# lightning.fabric.utilities.imports defines it, its importers bind their own name.
_LIGHTNING_PACKAGES = ("lightning", "lightning_fabric", "pytorch_lightning")
_LIGHTNING_FLAG = "_IS_INTERACTIVE"

# Made in the kernel, inherited by every fork: a rank then builds nothing (see prepare()).
_PYTHON_EXIT = {name: _sitebuiltins.Quitter(name, "Ctrl-D (i.e. EOF)") for name in ("exit", "quit")}
_found: dict[str, Any] = {"modules": None, "flagged": ()}


def become_rank() -> None:
    """Drop what the kernel's interactive shell left in this process (see the module's doc).

    Call it after ``display_hooks.install``: a rank that imports IPython without a shell gets a
    quiet one for display(), and IPython's shell sets ``sys.ps1`` itself when it is made.
    """
    _forget_shell()
    ipython = sys.modules.get("IPython")
    if ipython is not None:  # imported in the kernel: no shell was made since, nothing to forget again
        _silence_get_ipython(ipython)
    else:
        when_imported("IPython", _after_ipython)  # at import
    if _found["flagged"]:
        correct_lightning_flags(_found["flagged"])


def _forget_shell() -> None:
    for name in ("ps1", "ps2"):
        if hasattr(sys, name):
            delattr(sys, name)
    _forget_shell_names(builtins.__dict__)
    main = sys.modules.get("__main__")
    if main is not None:
        _forget_shell_names(main.__dict__)


def _after_ipython(ipython_module: Any) -> None:
    _silence_get_ipython(ipython_module)
    _forget_shell()  # again: a shell made for display() at this import set its prompts


def prepare() -> None:
    """Kernel side, before a fork: which modules hold Lightning's flag (``os.register_at_fork``).

    A rank scanning its thousands of inherited modules would touch (and so copy) their pages:
    70 ms a rank once lightning was imported. The kernel scans again only when modules were
    imported since its last scan.

    Example:
        >>> prepare()  # lightning not imported here: no module to correct in the ranks
    """
    _hold_shell_names()
    modules = (len(sys.modules), next(reversed(sys.modules), None))  # what changes when one is imported
    if modules != _found["modules"]:
        _found["modules"] = modules
        imported = any(name in sys.modules for name in _LIGHTNING_PACKAGES)
        _found["flagged"] = tuple(_modules_with_flag()) if imported else ()


_SHELL_NAMES = ("get_ipython", "__IPYTHON__", "exit", "quit")


def _hold_shell_names() -> None:
    """What a rank removes or replaces (IPython's names, ``get_ipython``'s code), held in the
    kernel: a rank dropping the last reference would free them, writing to the kernel's pages."""
    main = sys.modules.get("__main__")
    getter = getattr(sys.modules.get("IPython.core.getipython"), "get_ipython", None)
    held = [builtins.__dict__.get(name) for name in _SHELL_NAMES]
    held += [main.__dict__.get(name) for name in _SHELL_NAMES] if main is not None else []
    _found["held"] = (*held, getattr(getter, "__code__", None))


def interactive() -> bool:
    """What Lightning (and Python's own ``-i`` test) would compute in this process now.

    Example:
        >>> isinstance(interactive(), bool)
        True
    """
    return hasattr(sys, "ps1") or bool(sys.flags.interactive)


def correct_lightning_flags(names: tuple[str, ...] | None = None) -> list[str]:
    """Recompute Lightning's import-time ``_IS_INTERACTIVE`` in each module holding a copy.

    ``names``: the modules to look at (default: every module of Lightning's packages). Returns
    those corrected. Lightning's launchers and connectors read their own copy, bound when the
    notebook imported lightning; correcting only the defining module would leave those.

    Example:
        >>> correct_lightning_flags()  # lightning not imported here: nothing to correct
        []
    """
    value = interactive()
    corrected = []
    for name in _modules_with_flag() if names is None else names:
        module = sys.modules.get(name)
        if module is not None and module.__dict__.get(_LIGHTNING_FLAG, value) is not value:
            setattr(module, _LIGHTNING_FLAG, value)
            corrected.append(name)
    return corrected


def _modules_with_flag() -> list[str]:
    return [
        name
        for name, module in list(sys.modules.items())
        if name.partition(".")[0] in _LIGHTNING_PACKAGES and isinstance(module, ModuleType) and _LIGHTNING_FLAG in module.__dict__
    ]


def _forget_shell_names(namespace: dict[str, Any]) -> None:
    """Remove IPython's names from ``namespace`` (builtins or ``__main__``); Python's exit stays."""
    shell_getter = namespace.get("get_ipython")
    if shell_getter is not None and _from_ipython(shell_getter):
        del namespace["get_ipython"]
    namespace.pop("__IPYTHON__", None)
    for name in ("exit", "quit"):
        if name in namespace and _from_ipython(namespace[name]):
            del namespace[name]
    if namespace is builtins.__dict__:
        _restore_python_exit()


def _from_ipython(value: Any) -> bool:
    owner = getattr(value, "__module__", None) or type(value).__module__
    return str(owner).startswith(("IPython", "ipykernel"))


def _restore_python_exit() -> None:
    """``exit`` / ``quit`` as ``site`` defines them (IPython's builtin trap hides them while a
    cell runs); a rank calling ``exit()`` then ends with SystemExit, as under torchrun."""
    for name, quitter in _PYTHON_EXIT.items():
        if not isinstance(builtins.__dict__.get(name), _sitebuiltins.Quitter):
            setattr(builtins, name, quitter)


def _no_shell() -> None:
    """What ``IPython.get_ipython()`` answers in a rank: no shell (None), as in a script."""


def _silence_get_ipython(ipython_module: Any) -> None:
    """Make IPython's ``get_ipython`` answer None, for every reference to it.

    Modules imported in the kernel hold the function itself (``from IPython import
    get_ipython``), so the function's code is swapped rather than the module attribute. The
    swap happens in this rank's copy of the process only.
    """
    original = sys.modules.get("IPython.core.getipython")
    function = getattr(original, "get_ipython", None)
    if function is not None and function.__code__ is not _no_shell.__code__:
        function.__code__ = _no_shell.__code__


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=prepare)
