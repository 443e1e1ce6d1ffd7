"""Persistent workers across the nodes of a ``Cluster``: the engine's ``WorkerPool`` behind the cluster seam.

Every rank of every node runs the same loop as a one-node pool (``nbaccel.pool.serve``): it joins
the process group once, says READY, then runs the tasks the kernel sends through its agent
(signed) in a namespace that lives as long as the worker. ``WorkerPool`` does the rest (push,
pull, run, status, stop, interrupts), as on one node; failures here also name the rank's node.

A pool outlives a node: when one is lost (its agent or machine stopped, its network cut), the
pool says which node and ranks, keeps the other nodes' workers as they are (``status()`` and
``stacks()`` still show them), refuses new tasks, and ``restart()`` brings it back on the nodes
still joined, or with ``wait_for=N`` on N nodes once a replacement agent joined. The lost node's
ranks died with their agent (``PR_SET_PDEATHSIG``), or with the agent that gave up on the kernel.

Example::

    pool = start_cluster_workers(cluster, LaunchOptions())   # what start_workers(cluster=cluster) runs
    pool.push(scale=10)
    pool.run(lambda: int(os.environ["RANK"]))     # [0, 1, 2, 3] on 2 nodes x 2 ranks
    pool.restart(wait_for=2)                      # after a node was lost and a new agent started
    pool.stop()
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

from nbaccel.cluster.cluster import Cluster, NodeInfo
from nbaccel.cluster.failures import naming_nodes
from nbaccel.cluster.group import ClusterGroupStarter, ClusterRankGroup
from nbaccel.cluster.plan import cluster_plan
from nbaccel.errors import RankFailedError
from nbaccel.launch.loop import EventLoop
from nbaccel.launch.notices import say
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.outcome import Status
from nbaccel.launch.seam import RankGroup
from nbaccel.output.sinks import Sink
from nbaccel.pool.pool import PoolStoppedError, WorkerPool, WorkerStatus
from nbaccel.pool.task_policy import Task


class NodeLostPoolError(PoolStoppedError):
    """A node of a running pool was lost; the other nodes' workers are kept until ``restart()``/``stop()``."""


class ClusterWorkers(WorkerPool):
    """A ``WorkerPool`` whose ranks run on the cluster's nodes (namespaces start empty there)."""

    def __init__(self, cluster: Cluster, options: LaunchOptions, start_timeout: float) -> None:
        # No seed namespace: a node cannot inherit the notebook's variables; push them instead.
        super().__init__(cluster_plan(cluster, options, time.monotonic()), ClusterGroupStarter(cluster), None, start_timeout)
        self.cluster = cluster
        self.options = options

    def start(self, output: str | Sink = "text") -> ClusterWorkers:
        try:
            super().start(output)
        except RankFailedError as error:
            raise naming_nodes(error, self.group_starter) from None  # type: ignore[arg-type]
        return self

    def restart(self, wait_for: int | str | None = None, timeout: float = 120.0, settle: float = 0.0) -> ClusterWorkers:
        """Fresh workers on the nodes joined now, or once ``wait_for`` nodes are (a replacement agent).

        ``wait_for="MIN:MAX"`` with ``settle=S``: as ``cluster.wait``. Every worker still running (a
        lost node's survivors included) is stopped first; nodes that joined since the last start are
        taken, lost ones dropped, and which is said.
        """
        before = self._node_names()
        self.stop()
        if wait_for is not None:
            self.cluster.wait(nodes=wait_for, timeout=timeout, settle=settle)
        # The same options on the nodes there now: rank counts follow the live nodes.
        self.plan = cluster_plan(self.cluster, self.options, time.monotonic())
        self._seed = None
        say_membership(before, self.cluster.live_nodes)
        return self.start()

    def _node_names(self) -> dict[str, str]:
        """The nodes the workers ran on: name -> words."""
        starter = self.group_starter
        group = starter.last_group if isinstance(starter, ClusterGroupStarter) else None
        return {slot.node.name: slot.node.describe() for slot in group.slots} if group is not None else {}

    @property
    def lost(self) -> list[str]:
        """What was said of each node lost since the workers started (empty while all are there)."""
        group = self._group
        if not isinstance(group, ClusterRankGroup):
            return []
        group.catch_up()
        return list(group.lost.values())

    def run_task(
        self,
        task: Callable[[dict[str, Any]], Any],
        ranks: Sequence[int] | None = None,
        timeout: float | None = None,
        output: str | Sink | None = None,
        label: str = "",
        remember: bool = True,
    ) -> Any:
        try:
            return super().run_task(task, ranks, timeout, output, label, remember)
        except RankFailedError as error:
            raise naming_nodes(error, self.group_starter) from None  # type: ignore[arg-type]

    def _check_alive(self, group: RankGroup) -> None:
        if self.lost:
            raise NodeLostPoolError(self._lost_words())
        super()._check_alive(group)

    def _tear_down(self, loop: EventLoop, policy: Task, timeout: float | None) -> None:
        """A lost node's ranks ended mid-task: keep the survivors (inspect, then restart); else as on one node."""
        if not self.lost:
            super()._tear_down(loop, policy, timeout)
            return
        for outcome in loop.outcomes.values():
            if outcome.status is Status.RUNNING:
                outcome.status = Status.STOPPED
        say(self._lost_words())
        crashed = [o for o in policy.exited if o.rank >= 0]
        states = [*crashed, *(o for o in loop.outcomes.values() if o.rank not in {c.rank for c in crashed})]
        raise RankFailedError(crashed[0], sorted(states, key=lambda o: o.rank))

    def _lost_words(self) -> str:
        lost = "; ".join(self.lost)
        return (
            f"{lost}. The workers on the other nodes are kept as they are for inspection (pool.status(), pool.stacks()); "
            f"pool.restart() (%distributed restart) starts fresh workers on the {len(self.cluster.live_nodes)} node(s) still joined, "
            "or pool.restart(wait_for=N) (%distributed restart --wait-for N) once a replacement agent joined."
        )

    def _samples(self) -> dict[int, dict[str, Any]]:
        """Each rank's latest sample from its agent (agents sample their own ranks once a second)."""
        group = self._group
        if not isinstance(group, ClusterRankGroup):
            return {}
        group.catch_up()
        return dict(group.latest_samples)

    def _status_of(self, rank: int, answer: Any, sample: dict[str, Any] | None = None) -> WorkerStatus:
        status = super()._status_of(rank, answer, sample)
        group = self._group
        if isinstance(group, ClusterRankGroup) and group.slot_of[rank].node_rank in group.lost:
            return dataclasses.replace(status, state=f"lost with node {group.slot_of[rank].node_rank}")
        return status

    def __repr__(self) -> str:
        state = "running" if self.alive else "stopped"
        state += f", {len(self.lost)} node(s) lost: restart()" if self.alive and self.lost else ""
        return f"<ClusterWorkers {self.num_processes} ranks on the cluster at {self.cluster.address}, {state}>"


def say_membership(before: dict[str, str], now: Sequence[NodeInfo]) -> None:
    """Say which nodes a restart takes that were not there, and which it drops (lost)."""
    joined = [n.describe() for n in now if n.name not in before]
    dropped = [words for name, words in before.items() if name not in {n.name for n in now}]
    if joined or dropped:
        parts = ([f"node(s) {', '.join(joined)} joined since"] if joined else []) + ([f"node(s) {', '.join(dropped)} lost, dropped"] if dropped else [])
        say(f"restarting the workers on {len(now)} node(s): {'; '.join(parts)}")


def start_cluster_workers(cluster: Cluster, options: LaunchOptions, start_timeout: float = 120.0) -> ClusterWorkers:
    """Persistent workers on every rank of every live node; returns when all joined the group.

    ``num_processes``, ``gpus`` and ``start_method`` of ``options`` do not apply: the nodes decide.
    """
    return ClusterWorkers(cluster, options, start_timeout).start()
