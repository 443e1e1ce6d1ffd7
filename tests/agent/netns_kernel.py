"""The kernel of the network-namespace test, run inside namespace 0: sockets, then a cut network.

argv: CLUSTER_HOST NS1_EXEC_PREFIX CUT_COMMAND. Prints one JSON line for the test.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
import threading
import time

from nbaccel import Cluster, NodeRankFailedError, notebook_launcher
from nbaccel.cluster.group import layout
from nbaccel.testing import CollectingSink


def hold(seconds: float) -> int:
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    time.sleep(seconds)
    return dist.get_rank()


def listening(prefix: list[str]) -> list[str]:
    out = subprocess.run([*prefix, "ss", "-Hltn"], capture_output=True, text=True, timeout=10).stdout
    return [line.split()[3] for line in out.splitlines() if line.strip()]


def main() -> None:
    host, ns1, cut = sys.argv[1], shlex.split(sys.argv[2]), shlex.split(sys.argv[3])
    report: dict = {}
    with Cluster(f"{host}:0") as cluster:
        argv = [sys.executable, "-m", "nbaccel.agent", cluster.address, "--token-file", cluster.token_file, "--nproc-per-node", "2"]
        agents = [subprocess.Popen(argv), subprocess.Popen([*ns1, *argv], stderr=subprocess.PIPE, text=True)]
        cluster.wait(nodes=2, timeout=90)
        nodes = [slot.node for slot in layout(cluster.live_nodes, cluster.host)]  # in node-rank order
        report["nodes"] = [n.address for n in nodes]
        sockets: list[str] = []
        threading.Timer(1.0, lambda: sockets.extend(listening([]) + listening(ns1))).start()
        report["values"] = notebook_launcher(hold, (2.0,), cluster=cluster, output=CollectingSink())
        report["listening"] = sockets
        cut_at: list[float] = []
        threading.Timer(1.5, lambda: (cut_at.append(time.monotonic()), subprocess.run(cut, timeout=10))).start()
        try:
            notebook_launcher(hold, (60.0,), cluster=cluster, output=CollectingSink())
        except NodeRankFailedError as error:
            report["failed_after_cut_s"] = round(time.monotonic() - cut_at[0], 2)
            report["error"] = str(error).splitlines()[0]
            report["statuses"] = [o.status.value for o in error.outcomes]
        exit_started = time.monotonic()
        agents[1].wait(20)  # cut off, it must give up on the kernel by itself
        report["cut_agent_exit"] = [agents[1].returncode, round(time.monotonic() - exit_started, 2)]
        report["cut_agent_said"] = agents[1].stderr.read().strip().splitlines()[-1:] if agents[1].stderr else []
        cluster.close()
        agents[0].wait(15)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
