"""Validate a launch's arguments and decide its plan (ranks, devices, port) before anything starts.

Shared by ``notebook_launcher`` and the persistent worker pool.

Example:
    >>> make_plan(2, "no", None, "127.0.0.1", None, 0, None, True, 0.0).num_processes
    2
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from nbaccel.launch.rank_env import MIXED_PRECISIONS
from nbaccel.launch.seam import LaunchPlan, RankStarter
from nbaccel.launch.fork import ForkStarter
from nbaccel.launch.spawn import SpawnStarter
from nbaccel.launch.preflight import check_gpus, fork_error, fork_hazards, visible_gpu_count
from nbaccel.launch.rendezvous import is_loopback

START_METHODS = ("auto", "fork", "spawn")
DEFAULT_CPU_PROCESSES = 2


def check_arguments(function: Any, args: Any, num_processes: Any, mixed_precision: Any, start_method: Any, timeout: Any, max_restarts: Any, master_addr: Any) -> None:
    if not callable(function):
        raise TypeError(f"function must be callable, got {function!r} ({type(function).__name__}); pass the function itself, not its result.")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple or list of positional arguments, got {type(args).__name__} {args!r}; for one argument write args=(x,).")
    if num_processes is not None and (isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1):
        raise ValueError(f"num_processes must be a whole number >= 1, got {num_processes!r}.")
    if mixed_precision not in MIXED_PRECISIONS:
        raise ValueError(f"unknown mixed_precision {mixed_precision!r}; choose one of {', '.join(map(repr, MIXED_PRECISIONS))}.")
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}; choose one of {', '.join(map(repr, START_METHODS))}.")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"timeout must be a positive number of seconds or None, got {timeout!r}.")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a whole number >= 0, got {max_restarts!r}.")
    if not is_loopback(str(master_addr)):
        raise ValueError(
            f"master_addr={master_addr!r} is not a loopback address; a one-node launch rendezvous on "
            "loopback only (127.0.0.1), so nothing listens on a network. Leave master_addr at its default."
        )


def make_plan(num_processes: int | None, mixed_precision: str, use_port: int | str | None, master_addr: str, timeout: float | None, max_restarts: int, gpus: Sequence[int] | None, cpu: bool, started: float) -> LaunchPlan:
    port = _port(use_port)
    chosen_gpus: tuple[int, ...] | None = None
    visible = 0 if cpu else visible_gpu_count()
    if gpus is not None:
        if cpu:
            raise ValueError("gpus and cpu=True contradict each other: pass one of them.")
        chosen_gpus = check_gpus(gpus, visible)
        if num_processes is not None and num_processes != len(chosen_gpus):
            raise ValueError(f"num_processes={num_processes} but gpus={list(chosen_gpus)!r} names {len(chosen_gpus)} device(s); one rank runs per GPU.")
        num_processes = len(chosen_gpus)
    elif visible > 0:
        num_processes = visible if num_processes is None else num_processes
        if num_processes > visible:
            raise ValueError(
                f"num_processes={num_processes} but only {visible} GPU(s) are visible; one rank needs one GPU. "
                f"Use num_processes<={visible}, or cpu=True for CPU ranks on gloo."
            )
        chosen_gpus = tuple(range(visible))
    elif num_processes is None:
        num_processes = DEFAULT_CPU_PROCESSES
        print(f"nbaccel: no GPU visible; launching {num_processes} CPU processes on gloo.")
    device_type = "cuda" if chosen_gpus else "cpu"
    if mixed_precision == "fp8" and device_type == "cpu":
        raise ValueError("mixed_precision='fp8' needs GPUs that support fp8 (Hopper or newer); on CPU use 'bf16' or 'no'.")
    return LaunchPlan(
        num_processes=num_processes,
        device_type=device_type,
        gpus=chosen_gpus,
        mixed_precision=mixed_precision,
        master_addr=master_addr,
        port=port,
        max_restarts=max_restarts,
        timeout=timeout,
        deadline=None if timeout is None else started + timeout,
    )


def _port(use_port: int | str | None) -> int | None:
    if use_port is None:
        return None
    try:
        port = int(use_port)
    except (TypeError, ValueError):
        raise ValueError(f"use_port must be a port number, got {use_port!r}.") from None
    if not 0 < port < 65536:
        raise ValueError(f"use_port must be between 1 and 65535, got {use_port!r}.")
    return port


def choose_starter(start_method: str) -> RankStarter:
    """Fork when that is safe; else spawn (saying why, in one line), or refuse if fork was asked for."""
    if start_method == "spawn":
        return SpawnStarter()
    hazards = fork_hazards()
    if not hazards:
        return ForkStarter()
    if start_method == "fork":
        raise fork_error(hazards)
    print(f"nbaccel: {hazards[0]}; starting the ranks with spawn instead of fork (slower).", file=sys.stderr)
    return SpawnStarter()
