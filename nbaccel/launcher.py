"""``notebook_launcher`` and ``start_workers``: run a function on one process per GPU, or start workers.

Both check their arguments once (``LaunchOptions``), then dispatch ``cluster=`` here, above the
pool and ``nbaccel.cluster``, so nothing below knows which group starter runs the ranks
(``nbaccel/launch/seam.py``). They validate, decide and hand over: preflight and device choice
live in ``nbaccel.launch.plan``, the ranks in ``nbaccel.launch``, their output in ``nbaccel.output``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from nbaccel.errors import RankFailedError
from nbaccel.launch import warm
from nbaccel.launch.debug_desk import debuggable_job, wants_post_mortem
from nbaccel.launch.local import LocalGroupStarter
from nbaccel.launch.node_world import meet_nodes
from nbaccel.launch.notices import say
from nbaccel.launch.one_shot import run_launch
from nbaccel.launch.options import (
    DEFAULT_STALL_REPORT,
    LaunchOptions,
    MixedPrecision,
    OutputMode,
    RdzvBackend,
    StartMethod,
    check_callable,
    check_timeout,
    port_number,
    rdzv_items,
)
from nbaccel.launch.plan import choose_starter, make_plan
from nbaccel.launch.platform import require_linux
from nbaccel.launch.preview import LaunchPreview, preview_cluster, preview_launch
from nbaccel.launch.rendezvous import address_towards, is_loopback
from nbaccel.launch.seam import GroupStarter, LaunchPlan, RankStarter, Sink
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import line_prefix
from nbaccel.pool.pool import start_local_workers

if TYPE_CHECKING:
    from nbaccel.cluster.cluster import Cluster
    from nbaccel.pool.pool import WorkerPool

T = TypeVar("T")


def notebook_launcher(
    function: Callable[..., T],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: MixedPrecision = "no",
    use_port: int | str | None = None,
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: RdzvBackend = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
    *,
    start_method: StartMethod = "auto",
    timeout: float | None = None,
    gpus: Sequence[int] | None = None,
    cpu: bool = False,
    output: OutputMode | Sink | None = None,
    stall_report: float | None = DEFAULT_STALL_REPORT,
    cluster: Cluster | None = None,
    pdb: bool | None = None,
    profile: bool | str = False,
) -> list[T]:
    """Run ``function(*args)`` on ``num_processes`` ranks and return every rank's value, by rank.

    Each rank is forked from this process (the kernel), gets RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR/MASTER_PORT and its own GPU, and may call ``torch.distributed.init_process_group()``
    itself or let ``nbaccel.PartialState()`` do it; the launcher tears down whatever was created.
    Output of every rank is relayed live, labelled with its rank. The parameters up to
    ``log_line_prefix_template`` are Accelerate 1.x's, in its order; nbaccel's own are keywords.

    Args:
        function: what every rank runs; defined in the notebook or anywhere else.
        args: positional arguments for ``function``, the same on every rank.
        num_processes: ranks to start (on this node); default one per visible GPU, or 2 CPU ranks on gloo.
        mixed_precision: "no", "fp16", "bf16" or "fp8", exported for Accelerate and nbaccel's state.
        use_port: the rendezvous port. One node: default a free loopback port, fresh every launch
            (a port given is used, and refused at once if taken). ``num_nodes > 1``: the port
            every node meets at on ``master_addr`` (default 29500, Accelerate's).
        master_addr: the rendezvous address; a one-node launch listens on loopback only.
        node_rank: this machine's place among ``num_nodes`` (0 serves the rendezvous store).
        num_nodes: machines taking part, each running this call in its own notebook with its own
            ``node_rank``: they meet at ``master_addr:use_port`` before any rank starts, and
            this call returns its own ranks' values, in global rank order. With more than one
            node the store listens on ``master_addr`` (not loopback): anyone who can reach that
            address and port can join the process group while the launch runs. ``cluster=``
            is the better way to use several machines (docs/launcher.md).
        rdzv_backend: "static" (node ranks as given) or "c10d" (torch elastic's rendezvous:
            node ranks in order of arrival).
        rdzv_endpoint: "HOST:PORT" where the nodes meet; default ``master_addr:use_port``.
        rdzv_conf: ``join_timeout`` (seconds every node waits for the others, default 600),
            ``read_timeout``, ``last_call_timeout``, ``close_timeout``, ``is_host`` (c10d) and
            ``rank`` (static: must equal ``node_rank``).
        rdzv_id: the job's name in the rendezvous (TORCHELASTIC_RUN_ID of every rank with num_nodes > 1).
        max_restarts: relaunch every rank after a failure, up to this many times (one node).
        monitor_interval: accepted as Accelerate's; nbaccel's event loop waits on every rank's
            pipes and pidfd at once and wakes when something happens, so it has no polling
            period to set.
        log_line_prefix_template: the prefix of every text line, torch elastic's macros
            ``${role_name}``, ``${rank}`` (global) and ``${local_rank}`` filled in; default
            ``[rank N]`` and a space. The widget view keeps its layout.
        start_method: "auto" (fork; when forking is unsafe, nbaccel's fork server, else spawn),
            "fork", "forkserver" (ranks forked from nbaccel's fork server) or "spawn".
        timeout: seconds from the call after which every rank is stopped (LaunchTimeoutError).
        gpus: CUDA device indices to use, one rank each (default: the first ``num_processes``).
        cpu: run CPU ranks on gloo even where GPUs are visible.
        output: "text", "widgets", "auto" or a Sink; default from NBACCEL_OUTPUT, else "auto"
            (widgets in a frontend that renders them, text lines ``[rank N] ...`` elsewhere).
        stall_report: seconds without any output from any rank after which each rank's stack
            is shown once in its view, without stopping anything; None turns this off.
        cluster: an ``nbaccel.Cluster``: run on every rank of every node joined to it (values in
            global rank order; a failure names the rank's node). ``num_processes``, ``gpus``,
            ``use_port``, ``master_addr`` and ``start_method`` do not apply (docs/multinode.md).
        pdb: when a rank raises, open a post-mortem prompt in its frame, in this cell (the others
            wait meanwhile); the launch then fails as usual. Default: IPython's ``%pdb`` setting.
            ``breakpoint()`` on a rank prompts in the cell whatever this says (docs/debugging.md).
        profile: True or a folder: run each rank under torch.profiler, write each rank's trace and
            a merged one (``trace.json``, one lane per rank), and show where each rank spent its
            time (docs/profiling.md); True writes into the launch's log folder.

    Returns:
        ``[value of rank 0, value of rank 1, ...]`` (with ``num_nodes > 1``: this node's ranks).

    Raises:
        RankFailedError: a rank raised, crashed or exited early (the root-cause rank is named).
        LaunchTimeoutError: ``timeout`` passed.
        PreflightError: forking is unsafe and ``start_method="fork"`` was asked for, the port is
            taken, the nodes did not meet, or this is not Linux.
        ValueError, TypeError: bad arguments, before anything starts.

    Example:
        >>> def rank_and_world():
        ...     import torch.distributed as dist
        ...     dist.init_process_group("gloo")
        ...     return dist.get_rank(), dist.get_world_size()
        >>> notebook_launcher(rank_and_world, num_processes=2)
        [(0, 2), (1, 2)]
    """
    started = time.monotonic()
    check_callable(function, args)
    options = LaunchOptions(
        num_processes=num_processes,
        mixed_precision=mixed_precision,
        start_method=start_method,
        timeout=timeout,
        max_restarts=max_restarts,
        gpus=None if gpus is None else tuple(gpus),
        cpu=cpu,
        use_port=port_number(use_port),
        master_addr=master_addr,
        stall_report=stall_report,
        pdb=wants_post_mortem(pdb),
        profile=profile,
        node_rank=node_rank,
        num_nodes=num_nodes,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_conf=rdzv_items(rdzv_conf),
        rdzv_id=rdzv_id,
        monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )
    if cluster is not None:
        _one_way_to_several_machines(options)
        return _on_cluster(function, args, options, output, _check_cluster(cluster), started)
    require_linux("notebook_launcher")
    plan = make_plan(options, started)
    try:
        starter = choose_starter(options.start_method, plan.num_processes)
        if options.num_nodes > 1:
            return _on_nodes(starter, function, args, options, plan, output)
        return _run(LocalGroupStarter(starter), function, args, options, plan, output)
    finally:
        warm.import_noted()


def plan(
    function: Callable[..., Any] | None = None,
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: MixedPrecision = "no",
    use_port: int | str | None = None,
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: RdzvBackend = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
    *,
    start_method: StartMethod = "auto",
    timeout: float | None = None,
    gpus: Sequence[int] | None = None,
    cpu: bool = False,
    output: OutputMode | Sink | None = None,
    stall_report: float | None = DEFAULT_STALL_REPORT,
    cluster: Cluster | None = None,
    pdb: bool | None = None,
    profile: bool | str = False,
) -> LaunchPreview:
    """What ``notebook_launcher`` with these arguments would do now, without starting anything.

    The ranks, each rank's device and GPU, the backend, the start method and why (this kernel's
    fork hazards, the fork server), the GPUs skipped and why, the environment every rank gets and
    the notices the launch would print. ``print()`` it, or read its fields (``LaunchPreview``).
    The arguments are ``notebook_launcher``'s (``function`` and ``args`` may be left out).

    Example:
        >>> print(plan(num_processes=2, cpu=True))  # doctest: +ELLIPSIS
        nbaccel plan: 2 rank(s) on cpu, backend gloo, mixed precision no
        start: fork: this kernel is fork-safe: ...
        ...
    """
    if function is not None:
        check_callable(function, args)
    options = LaunchOptions(
        num_processes=num_processes,
        mixed_precision=mixed_precision,
        start_method=start_method,
        timeout=timeout,
        max_restarts=max_restarts,
        gpus=None if gpus is None else tuple(gpus),
        cpu=cpu,
        use_port=port_number(use_port),
        master_addr=master_addr,
        stall_report=stall_report,
        pdb=bool(pdb),
        profile=profile,
        node_rank=node_rank,
        num_nodes=num_nodes,
        rdzv_backend=rdzv_backend,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_conf=rdzv_items(rdzv_conf),
        rdzv_id=rdzv_id,
        monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )
    make_sink(output)  # a bad output is refused as the launch would refuse it
    if cluster is not None:
        from nbaccel.cluster.plan import cluster_plan

        _one_way_to_several_machines(options)
        live = _check_cluster(cluster).live_nodes
        return preview_cluster(
            options,
            cluster_plan(cluster, options, time.monotonic()),
            ", ".join(f"node {n.describe()}: {n.nproc} rank(s)" for n in live) or "no node joined yet",
        )
    require_linux("notebook_launcher")
    host, port = options.rendezvous_endpoint
    interface = None if options.num_nodes == 1 or is_loopback(host) else _interface(address_towards(host, port))
    return preview_launch(options, interface)


def _run(
    group_starter: GroupStarter,
    function: Callable[..., T],
    args: Sequence[Any],
    options: LaunchOptions,
    plan: LaunchPlan,
    output: str | Sink | None,
    first_rank: int = 0,
) -> list[T]:
    """The one-shot launch of ``function(*args)`` on the ranks ``group_starter`` starts, on one node or several."""
    sink = make_sink(output, line_prefix(options.log_line_prefix_template, first_rank))
    if options.profile:
        from nbaccel.output.profile_sink import profiled  # only a profiled launch imports any of it

        function, sink = profiled(function, sink, options.profile)
    return run_launch(group_starter, debuggable_job(function, args, options.pdb), plan, sink)


def _on_cluster(
    function: Callable[..., T], args: Sequence[Any], options: LaunchOptions, output: str | Sink | None, cluster: Cluster, started: float
) -> list[T]:
    """Every rank of every live node of ``cluster``; a failure names the node of its rank."""
    from nbaccel.cluster.failures import naming_nodes
    from nbaccel.cluster.group import ClusterGroupStarter
    from nbaccel.cluster.plan import cluster_plan

    group_starter = ClusterGroupStarter(cluster)
    try:
        return _run(group_starter, function, args, options, cluster_plan(cluster, options, started), output)
    except RankFailedError as error:
        raise naming_nodes(error, group_starter) from None


def _on_nodes(
    starter: RankStarter, function: Callable[..., T], args: Sequence[Any], options: LaunchOptions, plan: LaunchPlan, output: str | Sink | None
) -> list[T]:
    """One node of Accelerate's ``num_nodes`` launch: meet the other nodes' kernels, then run this node's ranks."""
    host, port = options.rendezvous_endpoint
    local_address = address_towards(host, port)
    interface = None if is_loopback(host) else _interface(local_address)
    meeting = meet_nodes(options, plan.num_processes, plan.device_type, interface, local_address)
    world = meeting.world
    say(
        f"node {world.node_rank} of {world.num_nodes} met the others at {host}:{port}: ranks {world.first_rank}..{world.first_rank + plan.num_processes - 1} "
        f"of {world.world_size} run here"
    )
    try:
        return _run(LocalGroupStarter(starter, world), function, args, options, plan, output, world.first_rank)
    except RankFailedError as error:  # the loop numbers this node's ranks from 0: say the node and the global rank
        from nbaccel.cluster.failures import NodeRankFailedError

        where = {o.rank: f"node {world.node_rank} of {world.num_nodes} (global rank {world.global_rank(o.rank)})" for o in error.outcomes}
        renamed = NodeRankFailedError(next(o for o in error.outcomes if o.rank == error.rank), error.outcomes, where)
        renamed.attempts = error.attempts
        raise renamed from None
    finally:
        meeting.close()


def _one_way_to_several_machines(options: LaunchOptions) -> None:
    if options.num_nodes > 1:
        raise ValueError(
            f"cluster= and num_nodes={options.num_nodes} are two ways to use several machines: pass cluster= alone (its nodes are its agents'), "
            "or num_nodes with node_rank in each machine's notebook."
        )


def _interface(local_address: str | None) -> str:
    """gloo's and NCCL's interface across nodes: the one holding this machine's address towards
    the store; "" (gloo chooses) when unknown. Loopback would be wrong across machines."""
    from nbaccel.agent.interfaces import interface_of  # fcntl: Linux only, imported when several nodes meet

    return (interface_of(local_address) if local_address else None) or ""


def start_workers(
    num_processes: int | None = None,
    *,
    gpus: Sequence[int] | None = None,
    mixed_precision: MixedPrecision = "no",
    cpu: bool = False,
    start_method: StartMethod = "auto",
    namespace: dict[str, Any] | None = None,
    start_timeout: float = 120.0,
    stall_report: float | None = DEFAULT_STALL_REPORT,
    cluster: Cluster | None = None,
) -> WorkerPool:
    """Start persistent workers and return when every rank has joined the process group.

    Args:
        num_processes: ranks to start; default one per visible GPU, or 2 CPU ranks on gloo.
        gpus, mixed_precision, cpu, start_method: as for ``notebook_launcher``.
        namespace: what every rank's namespace starts as (a copy, made by the fork); the magic
            passes the notebook's. Ignored under spawn: spawned ranks start empty.
        start_timeout: seconds to wait for every rank to be ready.
        stall_report: seconds without output from a cell on the workers after which each
            rank's stack is shown once (nothing is stopped); None turns this off.
        cluster: an ``nbaccel.Cluster``: a pool across every node joined to it (namespaces start
            empty there; ``num_processes``, ``gpus``, ``start_method`` and ``namespace`` do not
            apply; docs/multinode.md).

    Example:
        >>> pool = start_workers(2)
        >>> pool.run(lambda: 1)
        [1, 1]
        >>> pool.stop()
    """
    check_timeout(start_timeout, "start_timeout")
    options = LaunchOptions(
        num_processes=num_processes,
        mixed_precision=mixed_precision,
        start_method=start_method,
        gpus=None if gpus is None else tuple(gpus),
        cpu=cpu,
        stall_report=stall_report,
    )
    if cluster is not None:  # every rank of every node of the cluster
        from nbaccel.cluster.workers import start_cluster_workers

        return start_cluster_workers(_check_cluster(cluster), options, start_timeout)
    require_linux("start_workers")
    return start_local_workers(options, namespace, start_timeout)


def _check_cluster(cluster: Any) -> Cluster:
    """``cluster`` if it is an ``nbaccel.Cluster``; else a TypeError saying how to make one."""
    from nbaccel.cluster.cluster import Cluster

    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be an nbaccel.Cluster, got {cluster!r}; make one with nbaccel.Cluster('HOST:PORT').")
    return cluster
