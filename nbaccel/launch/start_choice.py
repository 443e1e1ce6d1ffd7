"""How a launch would start its ranks, and why, decided without starting anything.

``launch.plan.choose_starter`` acts on this decision (and says its reason in one line);
``nbaccel.plan()`` shows it. One function decides both, so a plan and a real launch give the
same reasons: the kernel's fork hazards (``launch.preflight``), the fork server's state, the
start method asked for.

Example:
    >>> start_choice("spawn", hazards=[], threaded=True).method
    'spawn'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nbaccel.errors import PreflightError
from nbaccel.launch import fork_server
from nbaccel.launch.preflight import fork_error, never_fork

FORKED_SERVER = "forked from this kernel before it became unsafe"
FRESH_SERVER = "a fresh interpreter; its first launch imports torch"


@dataclass(frozen=True)
class StartChoice:
    """``method``: "fork", "forkserver" or "spawn"; ``reason``: why, in words; ``said``: a launch
    says the reason in one line (a plain fork says nothing); ``one_thread``: forked ranks get one
    CPU thread each; ``required``: asked for by name, no fallback."""

    method: str
    reason: str
    said: bool = False
    one_thread: bool = False
    required: bool = False
    hazards: tuple[str, ...] = ()


def server_reason(hazard: str, how: str) -> str:
    return f"{hazard}; starting the ranks from nbaccel's fork server ({how})."


def spawn_reason(hazard: str) -> str:
    return f"{hazard}; starting the ranks with spawn instead of fork (slower)."


def server_how(how: str) -> str:
    """``ForkServer.how`` ("forked" or "exec'd") in words."""
    return FORKED_SERVER if how == "forked" else FRESH_SERVER


def server_usable() -> bool:
    """A fork server can run here (Linux pidfds) and is not turned off (NBACCEL_FORK_SERVER=off)."""
    return fork_server.supported() and fork_server.mode() != "off"


def start_choice(start_method: str, hazards: Sequence[str], threaded: bool) -> StartChoice:
    """What ``choose_starter`` would do now, given the kernel's fork ``hazards``
    (``preflight.fork_hazards()``) and whether each local rank would have more than one CPU
    thread (``threaded``); raises its PreflightErrors."""
    if start_method == "spawn":
        return StartChoice("spawn", "start_method='spawn' was asked for: each rank starts a fresh interpreter (empty namespace)", required=True)
    if start_method == "forkserver":
        if not fork_server.supported():
            raise PreflightError("start_method='forkserver' needs Linux 5.3 or newer (pidfds); this system has none. Use start_method='spawn'.")
        return StartChoice("forkserver", "start_method='forkserver' was asked for: the ranks are forked from nbaccel's fork server", required=True)
    fatal = never_fork(hazards)
    if fatal:
        if start_method == "fork":
            raise fork_error(fatal)
        if server_usable():
            running = fork_server.running_server()
            how = running.how if running is not None and running.alive() else "exec'd"  # an unsafe kernel can only exec one
            return StartChoice("forkserver", server_reason(fatal[0], server_how(how)), said=True, hazards=tuple(hazards))
        return StartChoice("spawn", spawn_reason(fatal[0]), said=True, hazards=tuple(hazards))
    if hazards:  # only the OpenMP pool
        running = fork_server.running_server()
        if start_method == "auto" and server_usable() and running is not None and running.alive():
            return StartChoice("forkserver", server_reason(hazards[0], server_how(running.how)), said=True, hazards=tuple(hazards))
        reason = f"{hazards[0]}; so each rank runs with one CPU thread (start_method='spawn' gives them all their cores)."
        return StartChoice("fork", reason, said=threaded, one_thread=True, hazards=tuple(hazards))
    return StartChoice("fork", "this kernel is fork-safe: each rank is forked from it and starts with the notebook's variables")
