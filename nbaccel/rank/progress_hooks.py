"""Rank side of progress bars: every tqdm bar in a rank becomes ``progress`` events.

A forked rank must not draw tqdm's notebook widget (its comm messages would be lost) nor
redraw a text bar a thousand times into its stderr pipe. So the tqdm classes are patched *in
place*, in the rank only: ``tqdm.std.tqdm.display`` sends the bar's state on the channel
(throttled), its text goes nowhere, and ``tqdm.notebook.tqdm`` (which ``tqdm.auto`` picks in a
kernel) loses its widget methods and behaves like the patched text bar. Patching the classes
themselves, not the module attributes, matters: a notebook that ran ``from tqdm.auto import
tqdm`` before the launch holds the class object in its globals.

Example (what ``rank_hooks.install`` does)::

    install(channel_fd)
    for step in tqdm(range(100)):  # one live bar in the rank's panel, no text lines
        ...
"""

from __future__ import annotations

import functools
import itertools
import re
import sys
import time
from typing import Any

from nbaccel.rank.import_hooks import when_imported
from nbaccel.wire import events, rich

MIN_INTERVAL = 0.05  # seconds between two events of one bar (tqdm itself defaults to 0.1)

# tqdm.notebook.tqdm_notebook's own members, all about its widget; without them the class
# falls back to tqdm.std.tqdm's (patched) behaviour.
_NOTEBOOK_MEMBERS = ("__init__", "status_printer", "display", "colour", "__iter__", "update", "close", "clear", "reset")

_PATCHED = ("__init__", "display", "close")  # tqdm.std.tqdm's methods that ``_patch_std`` replaces

_state: dict[str, Any] = {"fd": None}
_made: dict[str, Any] = {}  # "methods": (the originals, the patched methods made for them)
_ids = itertools.count()


class _NullFile:
    """Where a patched bar "prints": nowhere. ``isatty`` is True so ``disable=None`` keeps it on."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True


_NULL = _NullFile()


def install(channel_fd: int) -> None:
    """Patch tqdm in this rank (when it is, or once it gets, imported)."""
    _state["fd"] = channel_fd
    when_imported("tqdm.std", _patch_std)
    when_imported("tqdm.notebook", _patch_notebook)


def prepare() -> None:
    """Kernel side, before a fork: make the patched methods of an imported tqdm now, so that
    every rank only assigns them (see ``rank_hooks.prepare``).

    Example:
        >>> prepare()  # makes them if tqdm is imported; changes nothing in tqdm itself
    """
    module = sys.modules.get("tqdm.std")
    if module is not None and not getattr(module.tqdm, "_nbaccel_patched", False):  # not in a rank
        _patched_methods(module.tqdm)


def _patch_std(module: Any) -> None:
    cls = module.tqdm
    if getattr(cls, "_nbaccel_patched", False):
        return
    cls.__init__, cls.display, cls.close = _patched_methods(cls)
    cls._nbaccel_patched = True


def _patched_methods(cls: Any) -> tuple[Any, Any, Any]:
    """``__init__``, ``display`` and ``close`` for ``cls``, made once per set of originals.

    Made in the kernel by ``prepare`` when tqdm is imported there (they are only assigned in a
    rank), else in the rank; remade if the class's methods changed since.
    """
    # Keyed by what the class itself holds: tqdm's __init__ is a partialmethod, so reading
    # cls.__init__ gives a new function each time.
    originals = tuple(vars(cls).get(name) for name in _PATCHED)
    made = _made.get("methods")
    if made is None or any(a is not b for a, b in zip(made[0], originals, strict=True)):
        made = _made["methods"] = (originals, _make_methods(cls.__init__, cls.display, cls.close))
    return made[1]


def _make_methods(original_init: Any, original_display: Any, original_close: Any) -> tuple[Any, Any, Any]:
    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        self._nbaccel_bar = next(_ids)
        self._nbaccel_sent = 0.0
        self._nbaccel_to_file = _redirect_file(args, kwargs)
        original_init(self, *args, **kwargs)

    def display(self: Any, msg: str | None = None, pos: int | None = None) -> bool:
        if getattr(self, "_nbaccel_to_file", False):
            original_display(self, msg, pos)
        if not self.disable and msg is None:
            _send(self, closed=False, force=False)
        return True

    @functools.wraps(original_close)
    def close(self: Any) -> None:
        was_open = not getattr(self, "disable", True)
        original_close(self)
        if was_open and hasattr(self, "_nbaccel_bar"):
            _send(self, closed=True, force=True)

    return __init__, display, close


def _patch_notebook(module: Any) -> None:
    cls = module.tqdm_notebook
    for name in _NOTEBOOK_MEMBERS:
        if name in cls.__dict__:
            delattr(cls, name)


def _redirect_file(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Send the bar's text nowhere unless the user chose a file of their own; True if they did."""
    if len(args) >= 5:  # file given positionally: tqdm(iterable, desc, total, leave, file)
        return args[4] not in (None, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)
    file = kwargs.get("file")
    if file in (None, sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        kwargs["file"] = _NULL
        return False
    return True


def _send(bar: Any, closed: bool, force: bool) -> None:
    fd = _state["fd"]
    if fd is None:
        return
    now = time.monotonic()
    if not force and now - bar._nbaccel_sent < MIN_INTERVAL:
        return  # tqdm calls display() again on its next update; the state is not lost
    bar._nbaccel_sent = now
    try:
        event = _event(bar, closed)
    except Exception:  # noqa: BLE001 - a bar that cannot format itself must not stop training
        return
    events.send(fd, events.Kind.RICH, event)


def _event(bar: Any, closed: bool) -> dict[str, Any]:
    fmt = dict(bar.format_dict)
    text = bar.format_meter(**fmt)
    fmt["bar_format"] = (fmt.get("bar_format") or "{l_bar}<bar/>{r_bar}").replace("{bar}", "<bar/>")
    split = bar.format_meter(**fmt)
    if "<bar/>" in split:
        left, right = re.split(r"\|?<bar/>\|?", split, maxsplit=1)
    else:
        left, right = "", split
    leave = (abs(getattr(bar, "pos", 0)) == 0) if bar.leave is None else bool(bar.leave)
    failed = bool(closed and bar.total and bar.n < bar.total)
    return rich.progress_event(
        bar=bar._nbaccel_bar,
        n=bar.n,
        total=bar.total,
        left=left.strip(),
        right=right.strip(),
        text=text,
        closed=closed,
        leave=leave,
        failed=failed,
    )
