"""A launch on every node of a ``Cluster``: the multi-node ``Launcher`` behind the engine's seam.

Per attempt: the kernel assigns node ranks (a node on the kernel's own address first, then the
order the nodes joined) and global ranks (node
by node, so rank 0 is node 0's local rank 0), hosts a fresh rendezvous store bound to the
cluster's address, sends every node the signed launch (spec as JSON, job cloudpickled), and
watches until every node has finished. A fresh store and run id per attempt: torch elastic's own
restart with a shared store fails on a stale address (pytorch#135712).

Example::

    values = cluster_launcher(train, (), cluster)       # or notebook_launcher(..., cluster=)
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from nbaccel.agent import protocol
from nbaccel.agent.cluster import Cluster, NodeInfo
from nbaccel.agent.link import new_nonce
from nbaccel.agent.remote_watch import NodeSlot, RemoteWatch
from nbaccel.errors import PreflightError, RankFailedError
from nbaccel.launch.outcome import RankOutcome, Status, root_cause
from nbaccel.launch.rendezvous import LoopbackRendezvous
from nbaccel.launch.seam import Launcher, LaunchPlan
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import Sink
from nbaccel.rank.bootstrap import Job
from nbaccel.wire.portable import Sourced


class NodeRankFailedError(RankFailedError):
    """A rank on some node failed; the message names the rank and its node first."""

    def __init__(self, root: RankOutcome, outcomes: list[RankOutcome], where: dict[int, str]) -> None:
        self.where = where
        self.node = where.get(root.rank, "")
        super().__init__(root, outcomes)

    def _headline(self, root: RankOutcome) -> str:  # type: ignore[override]
        headline = RankFailedError._headline(root)
        where = getattr(self, "where", {}).get(root.rank)
        return headline.replace(f"rank {root.rank} ", f"rank {root.rank} on {where} ", 1) if where else headline


def layout(nodes: list[NodeInfo], kernel_host: str | None = None) -> list[NodeSlot]:
    """Node ranks: the kernel's own machine first (rank 0 beside the notebook), then join order;
    global ranks node by node."""
    ordered = sorted(nodes, key=lambda n: n.address != kernel_host)  # stable: join order otherwise
    slots, first = [], 0
    for node_rank, node in enumerate(ordered):
        slots.append(NodeSlot(node, node_rank, list(range(first, first + node.nproc))))
        first += node.nproc
    return slots


class ClusterLauncher(Launcher):
    """Runs every attempt on the cluster's live nodes."""

    start_method = "fork"  # on every node, through torch elastic's start_processes

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.last_slots: list[NodeSlot] = []

    def run_attempt(self, job: Job, plan: LaunchPlan, attempt: int, sink: Sink) -> list[RankOutcome]:
        running = begin_launch(self.cluster, job, plan, attempt)
        self.last_slots = running.slots
        watch = RemoteWatch(self.cluster, running.launch, running.slots, running.inbox, sink, plan.deadline, plan.timeout)
        sink.launch_started(running.world, attempt)
        try:
            return watch.run()
        finally:
            running.close()
            sink.launch_finished(watch.outcomes)


@dataclass
class RemoteLaunch:
    """One launch under way on the cluster: its id, node slots, message queue and store."""

    cluster: Cluster
    launch: str
    slots: list[NodeSlot]
    inbox: queue.Queue[tuple[str, NodeInfo, Any]]
    store: LoopbackRendezvous

    @property
    def world(self) -> int:
        return sum(len(s.ranks) for s in self.slots)

    def close(self) -> None:
        self.cluster.close_launch()
        self.store.close()


def begin_launch(cluster: Cluster, job: Job, plan: LaunchPlan, attempt: int) -> RemoteLaunch:
    """Host a fresh store, route a fresh launch id, and send every live node its part."""
    import cloudpickle

    nodes = cluster.live_nodes
    if not nodes:
        raise PreflightError(f"no node has joined the cluster at {cluster.address}; run `{cluster.agent_command()}` on each node, then cluster.wait(nodes=N).")
    slots = layout(nodes, cluster.host)
    # By value, with the cell's file name and source: tracebacks on a node show its lines.
    job_bytes = cloudpickle.dumps(Job(Sourced.wrap(job.function), job.args, job.pass_ends))
    launch = new_nonce()[:16]
    store = LoopbackRendezvous(cluster.host, None)  # bound to the cluster's address only
    inbox = cluster.open_launch(launch)
    running = RemoteLaunch(cluster, launch, slots, inbox, store)
    try:
        store.start_store(running.world)
        for slot in slots:
            spec = _spec(launch, plan, attempt, slot, len(slots), running.world, cluster.host, store.port)
            if not cluster.send(slot.node, protocol.LAUNCH, launch=launch, raw=protocol.pack_mixed(spec, job_bytes)):
                inbox.put(("lost", slot.node, "could not be sent the launch (its connection is gone)"))
    except BaseException:
        running.close()
        raise
    return running


def _spec(launch: str, plan: LaunchPlan, attempt: int, slot: NodeSlot, nnodes: int, world: int, master_addr: str, port: int) -> dict[str, Any]:
    return {
        "launch": launch,
        "run_id": f"nbaccel-{launch}-{attempt}",
        "attempt": attempt,
        "max_restarts": plan.max_restarts,
        "node_rank": slot.node_rank,
        "nnodes": nnodes,
        "first_rank": slot.ranks[0],
        "nproc": len(slot.ranks),
        "world_size": world,
        "master_addr": master_addr,
        "master_port": port,
        "device_type": plan.device_type,
        "mixed_precision": plan.mixed_precision,
        "gpus": None,
    }


def cluster_plan(cluster: Cluster, mixed_precision: str, timeout: float | None, max_restarts: int, cpu: bool, started: float) -> LaunchPlan:
    """The plan of a launch on the cluster's live nodes: CUDA only where every node has GPUs for its ranks."""
    nodes = cluster.live_nodes
    on_gpus = not cpu and bool(nodes) and all(n.gpus >= n.nproc for n in nodes)
    return LaunchPlan(
        num_processes=sum(n.nproc for n in nodes),
        device_type="cuda" if on_gpus else "cpu",
        gpus=None,
        mixed_precision=mixed_precision,
        master_addr=cluster.host,
        max_restarts=max_restarts,
        timeout=timeout,
        deadline=None if timeout is None else started + timeout,
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
) -> list[Any]:
    """Run ``function(*args)`` on every rank of every node of ``cluster``; values in global rank order.

    Raises NodeRankFailedError (the root-cause rank and its node), LaunchTimeoutError, or
    KeyboardInterrupt after stopping every node's ranks.

    Example::

        with nbaccel.Cluster("10.0.0.1:0") as cluster:
            cluster.wait(nodes=2)
            cluster_launcher(lambda: 1, cluster=cluster)   # [1, 1, 1, 1] on 2 nodes x 2 ranks
    """
    if not isinstance(cluster, Cluster):
        raise TypeError(f"cluster must be an nbaccel.Cluster, got {cluster!r}")
    started = time.monotonic()
    plan = cluster_plan(cluster, mixed_precision, timeout, max_restarts, cpu, started)
    return run_attempts(ClusterLauncher(cluster), Job(function, tuple(args)), plan, make_sink(output))


def run_attempts(launcher: ClusterLauncher, job: Job, plan: LaunchPlan, sink: Sink) -> list[Any]:
    """Attempts until one succeeds or ``max_restarts`` is spent (as nbaccel.launcher does)."""
    failed: list[list[RankOutcome]] = []
    for attempt in range(plan.max_restarts + 1):
        outcomes = launcher.run_attempt(job, plan, attempt, sink)
        if all(o.status is Status.SUCCEEDED for o in outcomes):
            return [o.value for o in outcomes]
        failed.append(outcomes)
    last = failed[-1]
    where = {rank: slot.where() for slot in launcher.last_slots for rank in slot.ranks}
    error = NodeRankFailedError(root_cause(last) or last[0], last, where)
    error.attempts = failed
    raise error
