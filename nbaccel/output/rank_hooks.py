"""Rank side of rich output: hooks installed in a rank so display(), figures and progress bars
reach the kernel as channel events (ipykernel drops what a forked child sends itself).

What ``install`` sets up, in the rank only:
  - a ``started`` event, so the kernel knows the rank is up;
  - IPython's display publisher replaced by one that sends ``display`` / ``clear_output``
    events: ``display(HTML(...))``, images, pandas tables, matplotlib's inline ``plt.show()``.
    A spawned rank has no IPython shell; one is created (without history) when the rank
    first imports IPython, so ``display()`` works there too instead of printing a repr;
  - comms (ipywidgets) made silent: a forked child writing to the kernel's zmq sockets could
    corrupt them, and the frontend would never see its widgets anyway;
  - tqdm bars as ``progress`` events (``nbaccel.output.rank_progress``).

Example (what the worker does right after redirecting stdio)::

    rank_hooks.install(channel_fd)
"""

from __future__ import annotations

import os
import sys
from typing import Any

from .. import channel
from . import events, rank_progress
from .import_hooks import when_imported

_state: dict[str, Any] = {"fd": None}


def install(channel_fd: int) -> None:
    """Install the rank's rich-output hooks, sending events on ``channel_fd``.

    Plain text needs no hook: it flows through the stdout/stderr pipes.
    """
    _state["fd"] = channel_fd
    channel.send(channel_fd, channel.Kind.EVENT, events.started_event(os.getpid()))
    when_imported("comm", _silence_comms)
    when_imported("IPython", _publish_displays)
    rank_progress.install(channel_fd)


def finish() -> None:
    """Show matplotlib figures still open, as a cell does when it ends (call before the result).

    Only the inline backend is flushed: with any other backend figures were never meant to be
    shown in the notebook.
    """
    pyplot = sys.modules.get("matplotlib.pyplot")
    inline = sys.modules.get("matplotlib_inline.backend_inline")
    if pyplot is None or inline is None or _state["fd"] is None:
        return
    try:
        if "inline" in str(pyplot.get_backend()) and pyplot.get_fignums():
            inline.show(close=True)
    except Exception as exc:  # noqa: BLE001 - a figure that cannot render must not lose the result
        print(f"nbaccel: could not show the rank's open figures ({type(exc).__name__}: {exc})", file=sys.stderr)


def _silence_comms(comm_module: Any) -> None:
    dummy = getattr(comm_module, "DummyComm", None)
    if dummy is None:
        return

    def create_comm(*args: Any, **kwargs: Any) -> Any:
        return dummy(*args, **kwargs)

    comm_module.create_comm = create_comm


def _publish_displays(ipython_module: Any) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    if not InteractiveShell.initialized():
        _start_quiet_shell(InteractiveShell)
    shell = InteractiveShell.instance()
    shell.display_pub = _publisher_class()(parent=shell, shell=shell)


def _start_quiet_shell(shell_class: Any) -> None:
    """A spawned rank's own IPython shell: only so display() formats and publishes (no history)."""
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell_class.instance(config=config)


def _publisher_class() -> type:
    """The display publisher class, built on first use (IPython is imported only if used)."""
    from IPython.core.displaypub import DisplayPublisher

    class RankDisplayPublisher(DisplayPublisher):  # type: ignore[misc]
        """Sends every display, update and clear to the kernel as a channel event."""

        def publish(self, data: dict[str, Any], metadata: dict[str, Any] | None = None, source: Any = None, *, transient: dict[str, Any] | None = None, update: bool = False, **kwargs: Any) -> None:
            display_id = (transient or {}).get("display_id")
            _send(events.display_event(data, metadata, display_id, update))

        def clear_output(self, wait: bool = False) -> None:
            _send(events.clear_event(wait))

    return RankDisplayPublisher


def _send(event: dict[str, Any]) -> None:
    fd = _state["fd"]
    if fd is None:
        return
    try:
        channel.send(fd, channel.Kind.EVENT, event)
    except Exception as exc:  # noqa: BLE001 - unpicklable metadata, say: show why, keep running
        print(f"nbaccel: could not forward a display to the kernel ({type(exc).__name__}: {exc})", file=sys.stderr)
