"""multiprocessing and atexit across the fork: a rank starts and ends like a process of its own.

A bare ``os.fork`` skips what ``multiprocessing`` does in a child it forks
(``multiprocessing/popen_fork.py`` -> ``BaseProcess._bootstrap``), and ``os._exit`` skips what
any Python process does at its end. Code written for multiprocessing then loses data: a queue
made in the notebook believes the kernel's feeder thread is its own (``qsize()`` counts items
``get()`` never sees), and items a rank put last are still in its buffer when it exits.

``start`` (right after the fork) does what ``_bootstrap`` does: a fresh process table (no
children, counter from 1), the after-fork hooks (queues reset their feeder, locks their owner,
Manager proxies reconnect), an empty finalizer registry; and it leaves the kernel's ``atexit``
handlers aside (the kernel runs them itself; a rank running them would, say, save the
notebook's history from a copy of it): from then on ``atexit.register`` records the rank's
own. ``finish`` (before ``os._exit``) runs the ``atexit`` handlers the rank's code registered (loggers, trackers' ``finish``, ``SummaryWriter.close``),
then multiprocessing's exit function (finalizers: queue feeders flush and join; the rank's
own children are joined), within ``NBACCEL_EXIT_TIMEOUT`` seconds (default 10): a handler that
hangs past that gets one line on stderr and the rank exits anyway.

A process multiprocessing itself forked already is such a child; ``start`` then leaves its
identity as multiprocessing made it.

Example (what ``run_rank`` does)::

    exit_hooks.start(parent_pid)
    code = execute(job, ends)
    exit_hooks.finish(code)
    os._exit(code)
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from nbaccel.wire.rank_env import EXIT_TIMEOUT, exit_timeout

_state: dict[str, Any] = {"started": False}
# atexit's own functions, which ``start`` replaces in a rank: held, so the rank frees nothing.
_ATEXIT = (atexit.register, atexit.unregister)


def start(parent_pid: int) -> None:
    """In a fresh rank: multiprocessing's after-fork work; the rank's own atexit handlers recorded.

    The kernel's handlers stay in ``atexit``'s table, which nothing in a rank runs (it ends with
    ``os._exit``); clearing the table would touch every one of them, and copy their pages.
    """
    atexit.register, atexit.unregister = _register, _unregister
    if "multiprocessing" in sys.modules and not _started_by_multiprocessing(parent_pid):
        _become_multiprocessing_child()
    _state["started"] = True


_handlers: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []  # the rank's own, in order


def _register(func: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """``atexit.register`` in a rank: kept for ``finish``, run last-in first-out."""
    _handlers.append((func, args, kwargs))
    return func


def _unregister(func: Callable[..., Any], /) -> None:
    """``atexit.unregister`` in a rank: every registration of ``func`` is dropped."""
    _handlers[:] = [entry for entry in _handlers if entry[0] != func]


def _started_by_multiprocessing(parent_pid: int) -> bool:
    """True when multiprocessing itself forked this process from ``parent_pid``, so its after-fork
    hooks already ran."""
    # current_process()'s own variable: the call would be code a fresh rank copies.
    current = getattr(sys.modules.get("multiprocessing.process"), "_current_process", None)
    return getattr(current, "_parent_pid", None) == parent_pid


def _become_multiprocessing_child() -> None:
    """What ``BaseProcess._bootstrap`` does in a child, for a process that is its own main.

    A torchrun rank is a fresh interpreter: its ``current_process()`` is "MainProcess" with no
    parent process. The kernel's authkey is kept (as a fork child keeps it), so Manager proxies
    and connections made in the notebook still authenticate.
    """
    process: Any = _module("multiprocessing.process")  # private names: typed Any
    util: Any = _module("multiprocessing.util")
    kernel_side = process._current_process
    if type(kernel_side).__name__ == "_MainProcess":  # the class itself is deleted from the module
        process._current_process = _prepared.get("main") or _main_process_like(kernel_side)
    process._parent_process = None
    process._children = _prepared.pop("children", None) or set()  # the kernel's children are not the rank's to join
    process._process_counter = _prepared.pop("counter", None) or itertools.count(1)
    if util._finalizer_registry:
        util._finalizer_registry.clear()  # the kernel's finalizers are the kernel's
    _run_after_forkers(util)
    del kernel_side


def _run_after_forkers(util: Any) -> None:
    """``util._run_after_forkers()``, from the list ``prepare`` sorted in the kernel: the
    registry's own iteration (a WeakValueDictionary's guards and generators) wrote ~20 pages."""
    registry = util._afterfork_registry.data
    items = _prepared.get("after_forkers")
    # Registered or dropped since (another thread, between the prepare and the fork): the registry
    # itself, as multiprocessing does. Keys are made from a counter: a newer one is the last key.
    if items is None or len(items) != len(registry) or (items and next(reversed(registry)) != items[-1][0]):
        util._run_after_forkers()
        return
    for (_, _, func), ref in items:
        obj = ref()
        if obj is not None:
            try:
                func(obj)
            except Exception as exc:  # noqa: BLE001 - as multiprocessing does: noted, not raised
                util.info("after forker raised exception %s", exc)


def _module(name: str) -> Any:
    """``name``, from ``sys.modules`` where the kernel imported it: the import machinery's own
    path, even for a module already imported, is code and objects a fresh rank would copy."""
    return sys.modules.get(name) or importlib.import_module(name)


def _main_process_like(kernel_side: Any) -> Any:
    me = type(kernel_side)()
    me._config = dict(kernel_side._config)  # authkey, semaphore prefix
    return me


_prepared: dict[str, Any] = {}


def prepare() -> None:
    """Kernel side, before a fork (``os.register_at_fork``): the "MainProcess" a forked rank
    becomes, made here once (again only when the kernel's authkey or prefix changed), so that
    each rank binds it instead of making one.

    Example:
        >>> import multiprocessing
        >>> prepare(); _prepared["main"].authkey == multiprocessing.current_process().authkey
        True
    """
    process: Any = sys.modules.get("multiprocessing.process")  # private names: typed Any
    kernel_side = getattr(process, "_current_process", None)
    if kernel_side is None or type(kernel_side).__name__ != "_MainProcess":
        _prepared.clear()
        return
    made = _prepared.get("main")
    if made is None or made._config != kernel_side._config:
        _prepared["main"] = _main_process_like(kernel_side)
    # The rank's empty process table and counter, made here: the kernel never uses them (each
    # fork takes its copy), so they are made once; a rank that took them makes its own before
    # it forks in turn.
    if "children" not in _prepared:
        _prepared["children"], _prepared["counter"] = set(), itertools.count(1)
    util = sys.modules.get("multiprocessing.util")
    if util is not None:  # weak references, as the registry holds them: the kernel keeps nothing alive
        _prepared["after_forkers"] = sorted(util._afterfork_registry.data.items(), key=_registry_key)
    # What the rank replaces, held here: a rank dropping the last reference would free them,
    # and freeing writes to the objects and their allocator's pages (copies of the kernel's).
    _prepared["kept"] = (kernel_side, process._children, process._process_counter)


def _registry_key(item: tuple[tuple[int, int, Any], Any]) -> tuple[int, int]:
    return item[0][0], item[0][1]  # multiprocessing's order: registration index first


def finish(exit_code: int) -> None:
    """Run the rank's atexit handlers, then multiprocessing's exit function, at most ``exit_timeout()``.

    The order of a Python process's end (handlers registered after multiprocessing's run
    first, so a handler that logs into a queue is flushed by the feeders' join). Only after
    ``start``: a rank that failed before it still holds the kernel's handlers. Past the
    deadline a watchdog thread says so in one line and ends the process with ``exit_code``.
    """
    if not _state["started"]:
        return
    _state["started"] = False
    if not _anything_to_run():
        return  # most ranks: no thread started for nothing
    limit = exit_timeout()
    done = threading.Event()
    watchdog = threading.Thread(target=_end_if_hung, args=(done, limit, exit_code), name="nbaccel-exit-watchdog", daemon=True)
    watchdog.start()
    try:
        _run_exit_functions()
    finally:
        done.set()
        watchdog.join()


def _anything_to_run() -> bool:
    if _handlers:
        return True
    process = sys.modules.get("multiprocessing.process")
    util = sys.modules.get("multiprocessing.util")
    return bool(util is not None and (util._finalizer_registry or (process is not None and process._children)))


def _run_exit_functions() -> None:
    util = sys.modules.get("multiprocessing.util")
    exit_function = getattr(util, "_exit_function", None)  # registered when imported in the rank: run last, once
    while _handlers:
        func, args, kwargs = _handlers.pop()
        if func is exit_function:
            continue
        try:
            func(*args, **kwargs)
        except BaseException:  # noqa: BLE001 - as at interpreter exit: say so, go on
            print(f"Exception ignored in atexit callback: {func!r}\n{traceback.format_exc()}", end="", file=sys.stderr)
    if exit_function is not None:
        try:
            exit_function()  # finalizers (queue feeders flush and join), own children joined
        except Exception as exc:  # noqa: BLE001 - as at interpreter exit: say so, go on
            print(f"nbaccel: multiprocessing's exit function failed: {type(exc).__name__}: {exc}", file=sys.stderr)


def _end_if_hung(done: threading.Event, limit: float, exit_code: int) -> None:
    if done.wait(limit):
        return
    # Straight to fd 2: the hung main thread may hold sys.stderr's lock.
    line = f"nbaccel: the rank's exit handlers (atexit, multiprocessing) still ran after {limit:g} s ({EXIT_TIMEOUT}); exiting without waiting for them\n"
    try:
        os.write(2, line.encode())
    finally:
        os._exit(exit_code)


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=prepare)
