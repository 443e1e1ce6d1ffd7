"""``notebook_launcher``: run a function on one process per GPU, forked from the kernel.

The function validates, decides, and hands over: preflight and device choice live in
``nbaccel.preflight``, the ranks in ``nbaccel.launchers``, their output in ``nbaccel.output``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from .env import MIXED_PRECISIONS
from .errors import RankFailedError
from .launchers.base import LaunchPlan, Launcher
from .launchers.fork import ForkStarter
from .launchers.local import LocalLauncher
from .launchers.spawn import SpawnStarter
from .outcome import RankOutcome, root_cause
from .output.select import make_sink
from .output.sinks import Sink
from .preflight import check_gpus, fork_error, fork_hazards, visible_gpu_count
from .rendezvous import is_loopback
from .worker import Job

T = TypeVar("T")

START_METHODS = ("auto", "fork", "spawn")
DEFAULT_CPU_PROCESSES = 2


def notebook_launcher(
    function: Callable[..., T],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: int | str | None = None,
    master_addr: str = "127.0.0.1",
    *,
    start_method: str = "auto",
    timeout: float | None = None,
    max_restarts: int = 0,
    gpus: Sequence[int] | None = None,
    cpu: bool = False,
    output: str | Sink | None = None,
) -> list[T]:
    """Run ``function(*args)`` on ``num_processes`` ranks and return every rank's value, by rank.

    Each rank is forked from this process (the kernel), gets RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR/MASTER_PORT and its own GPU, and may call ``torch.distributed.init_process_group()``
    itself or let ``nbaccel.PartialState()`` do it; the launcher tears down whatever was created.
    Output of every rank is relayed live, labelled with its rank.

    Args:
        function: what every rank runs; defined in the notebook or anywhere else.
        args: positional arguments for ``function``, the same on every rank.
        num_processes: ranks to start; default one per visible GPU, or 2 CPU ranks on gloo.
        mixed_precision: "no", "fp16", "bf16" or "fp8", exported for Accelerate and nbaccel's state.
        use_port: rendezvous port on ``master_addr``; default a free one, fresh every launch.
        master_addr: rendezvous address; a one-node launch listens on loopback only.
        start_method: "auto" (fork, or spawn when forking is unsafe), "fork" or "spawn".
        timeout: seconds from the call after which every rank is stopped (LaunchTimeoutError).
        max_restarts: relaunch every rank after a failure, up to this many times.
        gpus: CUDA device indices to use, one rank each (default: the first ``num_processes``).
        cpu: run CPU ranks on gloo even where GPUs are visible.
        output: "text", "widgets", "auto" or a Sink; default from NBACCEL_OUTPUT, else "auto"
            (widgets in a frontend that renders them, text lines ``[rank N] ...`` elsewhere).

    Returns:
        ``[value of rank 0, value of rank 1, ...]``.

    Raises:
        RankFailedError: a rank raised, crashed or exited early (the root-cause rank is named).
        LaunchTimeoutError: ``timeout`` passed.
        PreflightError: forking is unsafe and ``start_method="fork"`` was asked for, or the port is taken.
        ValueError, TypeError: bad arguments, before anything starts.

    Example:
        >>> def rank_and_world():
        ...     import torch.distributed as dist
        ...     dist.init_process_group("gloo")
        ...     return dist.get_rank(), dist.get_world_size()
        >>> notebook_launcher(rank_and_world, num_processes=2)  # doctest: +SKIP
        [(0, 2), (1, 2)]
    """
    started = time.monotonic()
    _check_arguments(function, args, num_processes, mixed_precision, start_method, timeout, max_restarts, master_addr)
    plan = _plan(num_processes, mixed_precision, use_port, master_addr, timeout, max_restarts, gpus, cpu, started)
    launcher = _choose_launcher(start_method)
    sink = make_sink(output)
    return _run(launcher, Job(function, tuple(args)), plan, sink)


def _run(launcher: Launcher, job: Job, plan: LaunchPlan, sink: Sink) -> list[Any]:
    failed_attempts: list[list[RankOutcome]] = []
    for attempt in range(plan.max_restarts + 1):
        outcomes = launcher.run_attempt(job, plan, attempt, sink)
        sink.launch_finished(outcomes)
        root = root_cause(outcomes)
        if root is None and all(o.status.value == "succeeded" for o in outcomes):
            return [o.value for o in outcomes]
        failed_attempts.append(outcomes)
        if attempt < plan.max_restarts:
            summary = root.describe() if root else "a rank did not return"
            print(f"nbaccel: attempt {attempt + 1} of {plan.max_restarts + 1} failed ({summary}); restarting all {plan.num_processes} ranks", file=sys.stderr)
    error = RankFailedError(root_cause(failed_attempts[-1]) or failed_attempts[-1][0], failed_attempts[-1])
    error.attempts = failed_attempts
    raise error


def _check_arguments(function: Any, args: Any, num_processes: Any, mixed_precision: Any, start_method: Any, timeout: Any, max_restarts: Any, master_addr: Any) -> None:
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


def _plan(num_processes: int | None, mixed_precision: str, use_port: int | str | None, master_addr: str, timeout: float | None, max_restarts: int, gpus: Sequence[int] | None, cpu: bool, started: float) -> LaunchPlan:
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


def _choose_launcher(start_method: str) -> Launcher:
    if start_method == "spawn":
        return LocalLauncher(SpawnStarter())
    hazards = fork_hazards()
    if not hazards:
        return LocalLauncher(ForkStarter())
    if start_method == "fork":
        raise fork_error(hazards)
    print(f"nbaccel: {hazards[0]}; starting the ranks with spawn instead of fork (slower).", file=sys.stderr)
    return LocalLauncher(SpawnStarter())
