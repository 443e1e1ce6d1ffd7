"""Two nodes from one "notebook": the script version of the multi-node example (run in CI).

On real machines you would make the cluster in the notebook, run the printed ``nbaccel-agent``
command on each node (by hand, ssh or srun: docs/multinode.md), and launch. Here the script
starts the agents itself, each behind an optional command prefix, so CI can put every "node" in
its own network namespace::

    python examples/08_two_nodes.py 127.0.0.1:0                       # two agents on loopback
    ip netns exec ns0 python examples/08_two_nodes.py 10.231.0.1:0 \\
        --node "" --node "ip netns exec ns1"                          # one agent per namespace

It prints every rank's output live (rank 0 first), the values in rank order, the root-cause
error of a rank that raises on node 1, and a last JSON line that tests read.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time

from nbaccel import NodeRankFailedError, notebook_launcher
from nbaccel.cluster.cluster import Cluster
from nbaccel.cluster.group import layout


def where_am_i() -> dict:
    """Every rank: join the process group across nodes, all_reduce, say where it runs."""
    import os
    import socket

    import torch
    import torch.distributed as dist

    import nbaccel

    state = nbaccel.PartialState(cpu=True)
    total = torch.tensor([float(state.process_index)])
    dist.all_reduce(total)
    print(
        f"rank {state.process_index} of {state.num_processes} on node {os.environ['NODE_RANK']} ({socket.gethostname()}), local rank {state.local_process_index}"
    )
    state.on_local_main_process(lambda: print(f"node {os.environ['NODE_RANK']}: local main process"))()
    return {"rank": state.process_index, "node": int(os.environ["NODE_RANK"]), "sum": total.item(), "gloo_interface": os.environ["GLOO_SOCKET_IFNAME"]}


def fail_on_node_1() -> None:
    import os
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    if os.environ["NODE_RANK"] == "1" and os.environ["LOCAL_RANK"] == "1":
        raise ValueError(f"rank {os.environ['RANK']} on node 1 gives up")
    dist.barrier()
    time.sleep(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("address", help="HOST:PORT for the cluster (port 0: any free one)")
    parser.add_argument("--node", action="append", help="command prefix that starts one node's agent (repeat per node; default: two local agents)")
    parser.add_argument("--nproc-per-node", type=int, default=2)
    arguments = parser.parse_args()
    prefixes = arguments.node if arguments.node is not None else ["", ""]
    summary: dict = {}
    with Cluster(arguments.address) as cluster:
        print(cluster)
        agents = [
            subprocess.Popen(
                [
                    *shlex.split(p),
                    sys.executable,
                    "-m",
                    "nbaccel.agent",
                    cluster.address,
                    "--token-file",
                    cluster.token_file,
                    "--nproc-per-node",
                    str(arguments.nproc_per_node),
                ]
            )
            for p in prefixes
        ]
        try:
            cluster.wait(nodes=len(prefixes), timeout=90)
            nodes = [slot.node for slot in layout(cluster.live_nodes, cluster.host)]  # in node-rank order
            summary["nodes"] = [(n.host, n.address, n.nproc) for n in nodes]
            started = time.monotonic()
            summary["values"] = notebook_launcher(where_am_i, cluster=cluster, output="text")
            summary["launch_s"] = round(time.monotonic() - started, 3)
            print("values in rank order:", summary["values"])
            started = time.monotonic()
            try:
                notebook_launcher(fail_on_node_1, cluster=cluster, output="text")
            except NodeRankFailedError as error:
                print(f"as expected: {str(error).splitlines()[0]}")
                summary["error"] = {
                    "rank": error.rank,
                    "node": error.node,
                    "headline": str(error).splitlines()[0],
                    "statuses": [o.status.value for o in error.outcomes],
                }
                summary["error_s"] = round(time.monotonic() - started, 3)
        finally:
            cluster.close()
            for agent in agents:
                agent.wait(15)
    summary["agent_exit_codes"] = [a.returncode for a in agents]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
