"""``%distributed cluster ADDRESS --via ...``: a cluster and its agents from one cell.

Makes an ``nbaccel.Cluster`` listening on ADDRESS, starts its agents (``cluster.start_agents``:
ssh to ``--hosts``, Slurm, or a command template), waits until they joined, binds the cluster to
a notebook variable (``-o``, default ``cluster``) and shows its nodes. Cells then use
``--cluster NAME``; ``cluster.close()`` stops the agents (and cancels a submitted Slurm job).

Example (in a notebook)::

    %distributed cluster 10.0.0.1 --via ssh --hosts node1 node2 --nproc-per-node 4
    %distributed start --cluster cluster
"""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError

from nbaccel.launch.notices import say
from nbaccel.notebook.magic_options import positive_int, variable_name


def add_parser(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """The ``cluster`` subcommand of ``%distributed``, its options declared here once."""
    parser = commands.add_parser("cluster", help="make an nbaccel.Cluster on ADDRESS, start its agents (ssh, Slurm, Ray, a command template) and wait for them")
    parser.add_argument("address", metavar="ADDRESS", help="this machine's address on the nodes' network, HOST[:PORT]")
    parser.add_argument(
        "--via", default="ssh", help="ssh, slurm, ray, or a command template with an {agent} word, e.g. 'kubectl exec -i {host} -- {agent}' (default: ssh)"
    )
    parser.add_argument("--hosts", nargs="+", metavar="HOST", help="ssh or template: one agent per host, node ranks in this order")
    parser.add_argument("--nproc-per-node", type=positive_int, metavar="N", help="ranks per node (default: one per GPU there, else 1)")
    parser.add_argument("--agent", metavar="PATH", help="nbaccel-agent on the nodes (default: this kernel's environment's, for a shared filesystem)")
    parser.add_argument("--ssh-config", metavar="FILE", help="ssh: the config file (ssh -F)")
    parser.add_argument("--ssh-option", action="append", default=[], metavar="OPT", help="ssh: one more option word, e.g. --ssh-option=-p --ssh-option=2222")
    parser.add_argument("--nodes", type=positive_int, metavar="N", help="slurm: nodes of the job (inside an allocation: default all of them); ray: bundles")
    parser.add_argument("--gpus-per-node", type=positive_int, metavar="G", help="slurm, submitting: GPUs per node; ray: GPUs per bundle")
    parser.add_argument("--cpus-per-node", type=positive_int, metavar="C", help="ray: CPUs per bundle (default: 1)")
    parser.add_argument("--strategy", metavar="S", help="ray: the placement group's strategy (default: STRICT_SPREAD, one bundle per Ray node)")
    parser.add_argument("--ray-address", metavar="HOST:PORT", help="ray: the Ray cluster, when this kernel is not attached yet (default: auto)")
    parser.add_argument("--time", metavar="LIMIT", help="slurm, submitting: the job's time limit, e.g. 04:00:00")
    parser.add_argument("--partition", metavar="NAME", help="slurm, submitting: the partition")
    parser.add_argument(
        "--sbatch-option", action="append", default=[], metavar="OPT", help="slurm: one more sbatch/srun option, e.g. --sbatch-option=--account=ml"
    )
    parser.add_argument("--token-dir", metavar="DIR", help="where the token file goes (default: ~/.nbaccel/clusters, private; the nodes must see it for Slurm)")
    parser.add_argument("--wait-timeout", type=float, default=300.0, metavar="S", help="seconds to wait for the agents (default: 300)")
    parser.add_argument("-o", "--out", type=variable_name, default="cluster", metavar="NAME", help="the notebook variable for the cluster (default: cluster)")


def start_cluster(args: argparse.Namespace, user_ns: dict[str, Any]) -> Any:
    """Carry out ``%distributed cluster``: the cluster, bound to ``args.out``, with its agents joined."""
    from nbaccel.cluster.cluster import AgentStartError, Cluster

    previous = user_ns.get(args.out)
    if isinstance(previous, Cluster) and not previous._closed:
        raise UsageError(f"%distributed cluster: {args.out!r} is an open cluster already ({previous.address}); {args.out}.close() first, or -o ANOTHER_NAME.")
    try:
        cluster = Cluster(args.address, token_dir=args.token_dir)
    except (ValueError, OSError) as error:
        raise UsageError(f"%distributed cluster {args.address}: {error}") from None
    try:
        starts = cluster.start_agents(
            args.via, args.hosts, agent=args.agent, nproc_per_node=args.nproc_per_node, ssh_options=args.ssh_option, ssh_config=args.ssh_config,
            nodes=args.nodes, gpus_per_node=args.gpus_per_node, time=args.time, partition=args.partition, sbatch_options=args.sbatch_option,
            cpus_per_node=args.cpus_per_node, strategy=args.strategy, ray_address=args.ray_address,
        )  # fmt: skip
        cluster.wait(nodes=sum(start.expected for start in starts), timeout=args.wait_timeout)
    except (ValueError, TypeError, ImportError) as error:  # ImportError: via="ray" without Ray here
        cluster.close()
        raise UsageError(f"%distributed cluster: {error}") from None
    except (AgentStartError, TimeoutError, KeyboardInterrupt, OSError, RuntimeError):
        cluster.close()  # nothing started is left behind
        raise
    user_ns[args.out] = cluster
    say(f"{len(cluster.live_nodes)} node(s) joined; run cells there with --cluster {args.out}, and {args.out}.close() to stop the agents")
    return cluster
