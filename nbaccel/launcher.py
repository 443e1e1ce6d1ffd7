"""``notebook_launcher``: run a function on one process per GPU, forked from the kernel.

The function validates, decides, and hands over: preflight and device choice live in
``nbaccel.launch.preflight``, the ranks in ``nbaccel.launch``, their output in ``nbaccel.output``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from nbaccel.launch import warm
from nbaccel.launch.local import LocalLauncher
from nbaccel.launch.one_shot import run_launch
from nbaccel.launch.options import DEFAULT_STALL_REPORT, LaunchOptions, check_callable
from nbaccel.launch.plan import choose_starter, make_plan
from nbaccel.launch.seam import Sink
from nbaccel.output.choose import make_sink
from nbaccel.rank.bootstrap import Job

if TYPE_CHECKING:
    from nbaccel.agent.cluster import Cluster

T = TypeVar("T")


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
    stall_report: float | None = DEFAULT_STALL_REPORT,
    cluster: Cluster | None = None,
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
        stall_report: seconds without any output from any rank after which each rank's stack
            is shown once in its view, without stopping anything; None turns this off.
        cluster: an ``nbaccel.Cluster``: run on every rank of every node joined to it (values in
            global rank order; a failure names the rank's node). ``num_processes``, ``gpus``,
            ``use_port``, ``master_addr`` and ``start_method`` do not apply (docs/multinode.md).

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
        >>> notebook_launcher(rank_and_world, num_processes=2)
        [(0, 2), (1, 2)]
    """
    if cluster is not None:
        from nbaccel.agent.remote import cluster_launcher

        return cluster_launcher(function, args, cluster, mixed_precision=mixed_precision, timeout=timeout, max_restarts=max_restarts, cpu=cpu, output=output, stall_report=stall_report)
    started = time.monotonic()
    check_callable(function, args)
    options = LaunchOptions(
        num_processes=num_processes,
        mixed_precision=mixed_precision,  # type: ignore[arg-type]  # checked by LaunchOptions
        start_method=start_method,  # type: ignore[arg-type]
        timeout=timeout,
        max_restarts=max_restarts,
        gpus=None if gpus is None else tuple(gpus),
        cpu=cpu,
        use_port=use_port,  # type: ignore[arg-type]  # a str port is parsed by LaunchOptions
        master_addr=master_addr,
        stall_report=stall_report,
    )
    plan = make_plan(options, started)
    launcher = LocalLauncher(choose_starter(options.start_method))
    try:
        return run_launch(launcher, Job(function, tuple(args)), plan, make_sink(output))
    finally:
        warm.import_noted()
