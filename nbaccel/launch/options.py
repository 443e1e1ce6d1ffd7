"""The options of a launch, validated once: ``notebook_launcher``, ``start_workers`` and both magics build one.

A ``LaunchOptions`` is frozen and checked when it is made, so everything after it (planning,
starting, watching) can trust it. Fixed choices are ``Literal`` types, so a type checker catches a
misspelt ``start_method`` before the notebook runs it.

Example:
    >>> LaunchOptions(num_processes=2, mixed_precision="bf16").mixed_precision
    'bf16'
    >>> LaunchOptions(start_method="thread")
    Traceback (most recent call last):
    ...
    ValueError: unknown start_method 'thread'; choose one of 'auto', 'fork', 'forkserver', 'spawn'.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from nbaccel.launch.rendezvous import is_loopback
from nbaccel.wire.rank_env import MIXED_PRECISIONS, MixedPrecision

__all__ = [
    "MIXED_PRECISIONS",
    "OUTPUT_MODES",
    "START_METHODS",
    "LaunchOptions",
    "MixedPrecision",
    "OutputMode",
    "StartMethod",
    "check_callable",
    "check_profile",
    "check_timeout",
    "profile_folder",
]

StartMethod = Literal["auto", "fork", "forkserver", "spawn"]
OutputMode = Literal["auto", "text", "widgets"]

START_METHODS: tuple[str, ...] = get_args(StartMethod)
OUTPUT_MODES: tuple[str, ...] = get_args(OutputMode)
DEFAULT_STALL_REPORT = 300.0  # five quiet minutes: long for a training loop that logs, short for a hang


@dataclass(frozen=True)
class LaunchOptions:
    """How to start the ranks of a launch or a pool; every field is checked on creation.

    Attributes:
        num_processes: ranks to start; None: one per visible GPU, or 2 CPU ranks on gloo.
        mixed_precision: exported for Accelerate and nbaccel's state.
        start_method: "auto" forks unless forking is unsafe (CUDA initialised), then starts the
            ranks from nbaccel's fork server, then (no server to be had) spawns.
        timeout: seconds after which every rank is stopped (one-shot launches and pool tasks).
        max_restarts: relaunches after a failure (one-shot launches).
        gpus: CUDA device indices, one rank each.
        cpu: CPU ranks on gloo even where GPUs are visible.
        use_port: the rendezvous port; None: a free one, fresh for every attempt.
        master_addr: the rendezvous address; one-node launches accept loopback only.
        stall_report: when no rank has printed or progressed for this many seconds, show each
            rank's stack once (nothing is stopped); None turns the watch off.
        pdb: a rank that raises stays at its exception while the cell opens a post-mortem
            prompt in its frame (docs/debugging.md); the launch fails once it is left.
        profile: run each rank under torch.profiler and write its trace, a merged trace and a
            summary (docs/profiling.md): True (into the launch's log folder) or a folder's path.
    """

    num_processes: int | None = None
    mixed_precision: MixedPrecision = "no"
    start_method: StartMethod = "auto"
    timeout: float | None = None
    max_restarts: int = 0
    gpus: tuple[int, ...] | None = None
    cpu: bool = False
    use_port: int | None = None
    master_addr: str = "127.0.0.1"
    stall_report: float | None = DEFAULT_STALL_REPORT
    pdb: bool = False
    profile: bool | str = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "profile", check_profile(self.profile))
        _check_choice("mixed_precision", self.mixed_precision, MIXED_PRECISIONS)
        _check_choice("start_method", self.start_method, START_METHODS)
        if self.num_processes is not None and not _is_whole(self.num_processes, 1):
            raise ValueError(f"num_processes must be a whole number >= 1, got {self.num_processes!r}.")
        check_timeout(self.timeout)
        check_timeout(self.stall_report, "stall_report")
        if not isinstance(self.pdb, bool):
            raise TypeError(f"pdb must be True or False, got {self.pdb!r}.")
        if not _is_whole(self.max_restarts, 0):
            raise ValueError(f"max_restarts must be a whole number >= 0, got {self.max_restarts!r}.")
        if self.gpus is not None:
            object.__setattr__(self, "gpus", _gpu_tuple(self.gpus))
            if self.cpu:
                raise ValueError("gpus and cpu=True contradict each other: pass one of them.")
        object.__setattr__(self, "use_port", _port(self.use_port))
        if not is_loopback(str(self.master_addr)):
            raise ValueError(
                f"master_addr={self.master_addr!r} is not a loopback address; a one-node launch rendezvous on "
                "loopback only (127.0.0.1), so nothing listens on a network. Leave master_addr at its default."
            )


def check_callable(function: Any, args: Any) -> None:
    """What every rank will run: a callable and a sequence of positional arguments."""
    if not callable(function):
        raise TypeError(f"function must be callable, got {function!r} ({type(function).__name__}); pass the function itself, not its result.")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments, got {type(args).__name__} {args!r}; for one argument write args=(x,).")


def check_profile(profile: Any) -> bool | str:
    """``profile=``: True/False, or the folder for the traces (a str or path, made if missing)."""
    if isinstance(profile, bool):
        return profile
    if isinstance(profile, (str, os.PathLike)) and str(os.fspath(profile)).strip():
        return str(os.fspath(profile))
    raise ValueError(f"profile must be True, False or a folder for the traces, got {profile!r}.")


def profile_folder(profile: bool | str) -> str | None:
    """The folder asked for, or None for the launch's log folder (``profile=True``)."""
    return profile if isinstance(profile, str) else None


def check_timeout(timeout: Any, name: str = "timeout") -> None:
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0):
        raise ValueError(f"{name} must be a positive number of seconds or None, got {timeout!r}.")


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}.")


def _is_whole(value: Any, minimum: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= minimum


def _gpu_tuple(gpus: Sequence[int] | Any) -> tuple[int, ...]:
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise TypeError(f"gpus must be a list of CUDA device indices such as [0, 1], got {gpus!r}.")
    return tuple(gpus)


def _port(use_port: Any) -> int | None:
    if use_port is None:
        return None
    try:
        port = int(use_port)
    except (TypeError, ValueError):
        raise ValueError(f"use_port must be a port number, got {use_port!r}.") from None
    if not 0 < port < 65536:
        raise ValueError(f"use_port must be between 1 and 65535, got {use_port!r}.")
    return port
