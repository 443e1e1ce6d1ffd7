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
  - tqdm bars as ``progress`` events (``nbaccel.rank.progress_hooks``).

Installing costs a forked rank little (every rank of every launch pays it): what can be made
ahead is made in the kernel, once (the publisher object, the pickled ``started`` event) or just
before each fork (``prepare``: tqdm's patched methods), and inherited by the fork.

Example (what the worker does right after redirecting stdio)::

    rank_hooks.install(channel_fd)
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import sys
from typing import Any

from nbaccel.rank import progress_hooks as rank_progress
from nbaccel.rank.import_hooks import when_imported
from nbaccel.wire import events, rich

_state: dict[str, Any] = {"fd": None}


def install(channel_fd: int) -> None:
    """Install the rank's rich-output hooks, sending events on ``channel_fd``.

    Plain text needs no hook: it flows through the stdout/stderr pipes.
    """
    _state["fd"] = channel_fd
    _send_started(channel_fd, os.getpid())
    when_imported("comm", _silence_comms)
    when_imported("IPython", _publish_displays)
    when_imported("matplotlib_inline.backend_inline", _integrate_inline_figures)
    rank_progress.install(channel_fd)


def prepare() -> None:
    """Kernel side, before a fork: build what the ranks would otherwise each build themselves.

    Registered with ``os.register_at_fork`` (so it also covers a library imported after
    nbaccel); idempotent and a few dictionary lookups once done.

    Example:
        >>> prepare()  # nothing to see: tqdm's patched methods are ready if tqdm is imported
    """
    try:
        rank_progress.prepare()
        # The shell (found here: traitlets' lookup is code a rank would copy), and what a rank
        # replaces, held so that the rank frees nothing: the shell's publisher, comm's factory.
        shell_class = getattr(sys.modules.get("IPython"), "InteractiveShell", None)
        shell = shell_class.instance() if shell_class is not None and shell_class.initialized() else None
        _state["shell"] = shell
        _state["kept"] = (getattr(shell, "display_pub", None), getattr(sys.modules.get("comm"), "create_comm", None))
    except Exception:  # noqa: BLE001 - a fork must never fail for this; the rank builds them itself
        pass


# The started event, pickled once with a placeholder pid that the rank overwrites: a forked
# rank then sends it without building a dict or running the pickler. The placeholder is above
# any pid Linux hands out (pid_max <= 2**22) and pickles as a 4-byte int (BININT), as every pid will.
_PID_PLACEHOLDER = 0x7EADBEEF
_PID_FIELD = pickle.BININT + struct.pack("<i", _PID_PLACEHOLDER)


def _started_template() -> tuple[bytes, bytes] | None:
    """The pickled ``started`` event split around its pid field; None if the pickler's output
    does not have the expected form (then each rank pickles its own)."""
    head, found, tail = events.dumps(rich.started_event(_PID_PLACEHOLDER)).partition(_PID_FIELD)
    return (head, tail) if found and _PID_FIELD not in tail else None


_STARTED = _started_template()


def started_payload(pid: int) -> bytes:
    """The pickled ``started`` event of ``pid``, as ``events.dumps(rich.started_event(pid))``.

    Example:
        >>> events.loads(started_payload(4194304)) == rich.started_event(4194304)
        True
    """
    if _STARTED is None or not 0 <= pid < 2**31:
        return events.dumps(rich.started_event(pid))
    head, tail = _STARTED
    return head + pickle.BININT + struct.pack("<i", pid) + tail


def _started_frame() -> tuple[bytes, bytes] | None:
    """The whole started frame (its header included) split around the pid's 4 bytes: its
    length is the same for every pid."""
    if _STARTED is None:
        return None
    head, tail = _STARTED
    header = events.encode_header(events.Kind.RICH, len(head) + len(_PID_FIELD) + len(tail))
    return header + head + pickle.BININT, tail


_STARTED_FRAME = _started_frame()


def _send_started(channel_fd: int, pid: int) -> None:
    """The started event, as ``events.send_bytes`` sends it: a frame of fewer than ``PIPE_BUF``
    bytes is written whole by one ``write`` (no interrupt can split it, and no other thread of a
    starting rank sends), so its lock and signal mask, whose code a fresh rank copied, are skipped."""
    if _STARTED_FRAME is None or not 0 <= pid < 2**31 or len(_STARTED_FRAME[0]) + len(_STARTED_FRAME[1]) + 4 > select.PIPE_BUF:
        events.send_bytes(channel_fd, events.Kind.RICH, started_payload(pid))
        return
    frame = b"".join((_STARTED_FRAME[0], pid.to_bytes(4, "little", signed=True), _STARTED_FRAME[1]))
    if os.write(channel_fd, frame) != len(frame):  # not on a blocking pipe; a broken stream otherwise
        raise OSError(f"the started event was written in part ({len(frame)} bytes): the channel is not a pipe")


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
    if getattr(comm_module, "DummyComm", None) is not None:
        comm_module.create_comm = _create_dummy_comm


def _create_dummy_comm(*args: Any, **kwargs: Any) -> Any:
    """``comm.create_comm`` in a rank: a comm that sends nothing (defined here, not per rank)."""
    return sys.modules["comm"].DummyComm(*args, **kwargs)


def _publish_displays(ipython_module: Any) -> None:
    # The package's own name for the class: an import statement costs a fresh fork ~50 µs.
    shell_class = ipython_module.InteractiveShell
    shell = _state.get("shell")  # the kernel's, found before the fork
    if shell is None:
        if not shell_class.initialized():
            _start_quiet_shell(shell_class)
        shell = shell_class.instance()
    # A plain attribute of the shell (not a trait), so any object with the publisher's methods
    # will do: IPython.display's display(), update_display() and clear_output() call only these.
    shell.display_pub = _PUBLISHER


def _integrate_inline_figures(backend_inline: Any) -> None:
    """Register the inline backend's figure formats on the rank's shell, if its import did not.

    The backend does it at import only when ``get_ipython()`` answers, which it does not in a
    rank (``process_identity``): a rank that is first to import pyplot would show its figures
    as ``<Figure size ...>``. The shell object is still there, only for display().
    """
    configure = getattr(backend_inline, "configure_inline_support", None)
    shell_class = sys.modules["IPython"].InteractiveShell
    if configure is None or getattr(configure, "current_backend", "unset") != "unset" or not shell_class.initialized():
        return  # done already (the kernel imported it first), or nothing to configure
    import matplotlib
    from IPython.core.pylabtools import activate_matplotlib

    backend = str(matplotlib.rcParams._get("backend"))
    if backend in ("inline", "module://matplotlib_inline.backend_inline"):
        activate_matplotlib(backend)  # type: ignore[no-untyped-call]
        configure(shell_class.instance(), backend)


def _start_quiet_shell(shell_class: Any) -> None:
    """A spawned rank's own IPython shell: only so display() formats and publishes (no history)."""
    from traitlets.config import Config

    config = Config()
    config.HistoryManager.enabled = False
    shell_class.instance(config=config)


class RankDisplayPublisher:
    """Sends every display, update and clear to the kernel as a channel event.

    Duck-types IPython's ``DisplayPublisher`` rather than subclassing it: a traitlets class
    costs a forked rank about a millisecond to build and instantiate, this one nothing (it is
    made once, in the kernel, and inherited by every fork).

    Example (in a rank, after ``install``)::

        display(HTML("<b>hi</b>"))  # -> publish({"text/html": ..., "text/plain": ...}, {})
    """

    is_publishing = False  # read by IPython's output capture while it tees stdout
    _in_post_execute = False  # read by ipykernel's display history

    def publish(
        self,
        data: dict[str, Any],
        metadata: dict[str, Any] | None = None,
        source: Any = None,
        *,
        transient: dict[str, Any] | None = None,
        update: bool = False,
        **kwargs: Any,
    ) -> None:
        display_id = (transient or {}).get("display_id")
        _send(rich.display_event(data, metadata, display_id, update))

    def clear_output(self, wait: bool = False) -> None:
        _send(rich.clear_event(wait))


_PUBLISHER = RankDisplayPublisher()


def send_event(event: dict[str, Any]) -> None:
    """Send one rich event (``nbaccel.wire.rich``) to the kernel; nothing outside a rank."""
    _send(event)


def _send(event: dict[str, Any]) -> None:
    fd = _state["fd"]
    if fd is None:
        return
    try:
        events.send(fd, events.Kind.RICH, event)
    except Exception as exc:  # noqa: BLE001 - unpicklable metadata, say: show why, keep running
        print(f"nbaccel: could not forward a display to the kernel ({type(exc).__name__}: {exc})", file=sys.stderr)


if hasattr(os, "register_at_fork"):  # not on Windows, where nbaccel starts no rank (nbaccel.launch.platform)
    os.register_at_fork(before=prepare)
