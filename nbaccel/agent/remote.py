"""Launches on every node of a ``Cluster``, through the engine's one-shot strategy.

``cluster_launcher`` is what ``notebook_launcher(..., cluster=)`` runs: the same ``run_launch``
(attempts, restarts, the one event loop, ``OneShot``) as a one-node launch, with the
``ClusterLauncher`` behind the seam. Its only addition: a failure names the node of its rank.

Example::

    values = cluster_launcher(train, (), cluster)       # [value of rank 0, rank 1, ...]
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from nbaccel.agent.cluster import Cluster, NodeInfo
from nbaccel.agent.cluster_group import ClusterLauncher, layout
from nbaccel.errors import RankFailedError, RankReport
from nbaccel.launch.debug_desk import debuggable_job, wants_post_mortem
from nbaccel.launch.one_shot import run_launch
from nbaccel.launch.options import LaunchOptions, check_callable, check_profile
from nbaccel.launch.seam import LaunchPlan
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import Sink

__all__ = ["NodeRankFailedError", "cluster_launcher", "cluster_plan", "layout", "naming_nodes"]


class NodeRankFailedError(RankFailedError):
    """A rank on some node failed; the message names the rank and its node first."""

    def __init__(self, root: RankReport, outcomes: Sequence[RankReport], where: dict[int, str]) -> None:
        self.where = where
        self.node = where.get(root.rank, "")
        super().__init__(root, outcomes)

    def _headline(self, root: RankReport) -> str:  # type: ignore[override]
        # Called from RankFailedError.__init__, after ``where`` is set; the outcome words it.
        return root.headline(node=getattr(self, "where", {}).get(root.rank, ""))

    def _render_traceback_(self) -> list[str]:
        lines = self.report().splitlines()
        return [f"NodeRankFailedError: {lines[0]}", *lines[1:]]


def naming_nodes(error: RankFailedError, launcher: ClusterLauncher) -> NodeRankFailedError:
    """``error`` again, its headline naming the node of its rank."""
    group = launcher.last_group
    where = {rank: group.where(rank) for rank in range(group.num_processes)} if group is not None else {}
    root = next(o for o in error.outcomes if o.rank == error.rank)
    renamed = NodeRankFailedError(root, error.outcomes, where)
    renamed.attempts = error.attempts
    return renamed


def cluster_plan(
    cluster: Cluster, mixed_precision: str, timeout: float | None, max_restarts: int, cpu: bool, started: float, stall_report: float | None = None
) -> LaunchPlan:
    """The plan of a launch on the cluster's live nodes: CUDA only where every node has a GPU per rank."""
    options = LaunchOptions(mixed_precision=mixed_precision, timeout=timeout, max_restarts=max_restarts, cpu=cpu, stall_report=stall_report)  # type: ignore[arg-type]  # checked there
    nodes = cluster.live_nodes
    on_gpus = not cpu and cluster_on_gpus(nodes)
    return LaunchPlan(
        num_processes=sum(n.nproc for n in nodes),
        device_type="cuda" if on_gpus else "cpu",
        gpus=None,
        mixed_precision=options.mixed_precision,
        master_addr=cluster.host,
        max_restarts=options.max_restarts,
        timeout=options.timeout,
        deadline=None if options.timeout is None else started + options.timeout,
        stall_report=options.stall_report,  # a remote rank's stack is not collected yet: only the note shows
    )


def cluster_on_gpus(nodes: Sequence[NodeInfo]) -> bool:
    """True when every node has a GPU per rank, False when none has any GPU; else a clear error.

    A cluster where some nodes lack GPUs for their ranks is not quietly turned to CPU and gloo
    (every GPU node would then train on its CPU): the user says which they meant.
    """
    if not nodes or all(n.gpus == 0 for n in nodes):
        return False
    short = [n for n in nodes if n.gpus < n.nproc]
    if not short:
        return True
    named = "; ".join(f"node {n.describe()} has {n.gpus} GPU(s) for {n.nproc} rank(s)" for n in short)
    raise ValueError(
        f"{named}: one CUDA rank needs one GPU. Start that node's agent with --nproc-per-node at most "
        "its GPU count, or pass cpu=True to run every rank of the cluster on CPU (gloo)."
    )


def cluster_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    cluster: Cluster | None = None,
    *,
    mixed_precision: str = "no",
    timeout: float | None = None,
    max_restarts: int = 0,
    cpu: bool = False,
    output: str | Sink | None = None,
    stall_report: float | None = None,
    pdb: bool | None = None,
    profile: bool | str = False,
) -> list[Any]:
    """Run ``function(*args)`` on every rank of every node of ``cluster``; values in global rank order.

    ``profile`` as ``notebook_launcher``'s: each node's ranks send their traces through their
    agent, and the kernel writes and merges them (lanes named by node).

    Raises NodeRankFailedError (the root-cause rank and its node), LaunchTimeoutError, or
    KeyboardInterrupt after stopping every node's ranks.

    Example::

        with nbaccel.Cluster("10.0.0.1:0") as cluster:
            cluster.wait(nodes=2)
            cluster_launcher(lambda: 1, cluster=cluster)   # [1, 1, 1, 1] on 2 nodes x 2 ranks
    """
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be an nbaccel.Cluster, got {cluster!r}; make one with nbaccel.Cluster('HOST:PORT').")
    started = time.monotonic()
    check_callable(function, args)
    plan = cluster_plan(cluster, mixed_precision, timeout, max_restarts, cpu, started, stall_report)
    launcher = ClusterLauncher(cluster)
    sink = make_sink(output)
    if check_profile(profile):
        from nbaccel.output.profile_sink import profiled  # only a profiled launch imports any of it

        function, sink = profiled(function, sink, check_profile(profile))
    try:
        return run_launch(launcher, debuggable_job(function, args, wants_post_mortem(pdb)), plan, sink)
    except RankFailedError as error:
        raise naming_nodes(error, launcher) from None
