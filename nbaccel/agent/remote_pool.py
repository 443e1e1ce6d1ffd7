"""Persistent workers across the nodes of a ``Cluster``: the engine's ``WorkerPool`` behind the cluster seam.

Every rank of every node runs the same loop as a one-node pool (``nbaccel.pool.serve``): it joins
the process group once, says READY, then runs the tasks the kernel sends through its agent
(signed) in a namespace that lives as long as the worker. ``WorkerPool`` does the rest (push,
pull, run, status, stop, interrupts), as on one node; failures here also name the rank's node.

Example::

    pool = start_cluster_workers(cluster)        # what start_workers(cluster=cluster) runs
    pool.push(scale=10)
    pool.run(lambda: int(os.environ["RANK"]))     # [0, 1, 2, 3] on 2 nodes x 2 ranks
    pool.stop()
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from nbaccel.agent.cluster import Cluster
from nbaccel.agent.cluster_group import ClusterLauncher
from nbaccel.agent.remote import cluster_plan, naming_nodes
from nbaccel.errors import RankFailedError
from nbaccel.launch.options import DEFAULT_STALL_REPORT, check_timeout
from nbaccel.launch.seam import LaunchPlan
from nbaccel.output.sinks import Sink
from nbaccel.pool.pool import WorkerPool


class ClusterWorkers(WorkerPool):
    """A ``WorkerPool`` whose ranks run on the cluster's nodes (namespaces start empty there)."""

    def __init__(self, cluster: Cluster, plan: LaunchPlan, start_timeout: float) -> None:
        # No seed namespace: a node cannot inherit the notebook's variables; push them instead.
        super().__init__(plan, ClusterLauncher(cluster), None, start_timeout)
        self.cluster = cluster

    def start(self, output: str | Sink = "text") -> ClusterWorkers:
        try:
            super().start(output)
        except RankFailedError as error:
            raise naming_nodes(error, self.launcher) from None  # type: ignore[arg-type]
        return self

    def run_task(self, task: Callable[[dict[str, Any]], Any], ranks: Sequence[int] | None = None, timeout: float | None = None, output: str | Sink | None = None, label: str = "", remember: bool = True) -> Any:
        try:
            return super().run_task(task, ranks, timeout, output, label, remember)
        except RankFailedError as error:
            raise naming_nodes(error, self.launcher) from None  # type: ignore[arg-type]

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        return f"<ClusterWorkers {self.num_processes} ranks on the cluster at {self.cluster.address}, {state}>"


def start_cluster_workers(
    cluster: Cluster, *, mixed_precision: str = "no", cpu: bool = False, start_timeout: float = 120.0, stall_report: float | None = DEFAULT_STALL_REPORT
) -> ClusterWorkers:
    """Persistent workers on every rank of every live node; returns when all joined the group."""
    check_timeout(start_timeout, "start_timeout")
    check_timeout(stall_report, "stall_report")
    plan = dataclasses.replace(cluster_plan(cluster, mixed_precision, None, 0, cpu, time.monotonic()), stall_report=stall_report)
    return ClusterWorkers(cluster, plan, start_timeout).start()
