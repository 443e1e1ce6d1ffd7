"""The plan of a launch or a pool on a cluster's live nodes: every rank of every node, GPUs only
where every node has a GPU for each of its ranks.

Example::

    plan = cluster_plan(cluster, LaunchOptions(mixed_precision="bf16"), started=time.monotonic())
    plan.num_processes     # the sum of every live node's --nproc-per-node
"""

from __future__ import annotations

from collections.abc import Sequence

from nbaccel.cluster.cluster import Cluster, NodeInfo
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.plan import plan_of
from nbaccel.launch.seam import LaunchPlan


def cluster_plan(cluster: Cluster, options: LaunchOptions, started: float) -> LaunchPlan:
    """``options`` on the cluster's live nodes now; ``started`` is when the call began.

    The nodes decide how many ranks and which devices; ``num_processes``, ``gpus``,
    ``start_method``, ``master_addr`` and ``use_port`` of the options do not apply (the agents fork
    their own ranks, the store listens on the cluster's address).
    """
    nodes = cluster.live_nodes
    on_gpus = not options.cpu and cluster_on_gpus(nodes)
    return plan_of(
        options,
        started,
        num_processes=sum(n.nproc for n in nodes),
        device_type=nodes[0].device_type if on_gpus else "cpu",
        gpus=None,
        master_addr=cluster.host,
        port=None,
    )


def cluster_on_gpus(nodes: Sequence[NodeInfo]) -> bool:
    """True when every node has a GPU per rank (all of one device type), False when none has any GPU; else a clear error.

    A cluster where some nodes lack GPUs for their ranks is not quietly turned to CPU and gloo
    (every GPU node would then train on its CPU): the user says which they meant.
    """
    if not nodes or all(n.gpus == 0 for n in nodes):
        return False
    kinds = sorted({n.device_type for n in nodes if n.gpus})
    if len(kinds) > 1:  # one process group has one backend: nccl and xccl cannot meet
        named = "; ".join(f"node {n.describe()} has {n.device_type} GPUs" for n in nodes if n.gpus)
        raise ValueError(f"{named}: one launch runs on one kind of GPU. Start agents on nodes of one kind, or pass cpu=True to run every rank on CPU (gloo).")
    short = [n for n in nodes if n.gpus < n.nproc]
    if not short:
        return True
    named = "; ".join(f"node {n.describe()} has {n.gpus} GPU(s) for {n.nproc} rank(s)" for n in short)
    raise ValueError(
        f"{named}: one GPU rank needs one GPU. Start that node's agent with --nproc-per-node at most "
        "its GPU count, or pass cpu=True to run every rank of the cluster on CPU (gloo)."
    )
