"""A launch across two agents from inside a real ipykernel, with functions defined in its cells."""

from __future__ import annotations

import pytest

from tests.kernel_harness import alive, running_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

SETUP = """
import subprocess, sys, os, time
import nbaccel
from nbaccel import notebook_launcher
cluster = nbaccel.Cluster("127.0.0.1:0")
argv = [sys.executable, "-m", "nbaccel.agent", cluster.address, "--token-file", cluster.token_file, "--nproc-per-node", "2"]
# Own sessions: Jupyter's interrupt signals the kernel's whole process group.
agents = [subprocess.Popen(argv, start_new_session=True) for _ in range(2)]
cluster.wait(nodes=2, timeout=60)
print(len(cluster.live_nodes), "nodes")
"""

DEFINE = """
def where(x):
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(1); dist.all_reduce(t)
    print(f"rank {os.environ['RANK']} on node {os.environ['NODE_RANK']}, world {t.item():g}")
    return int(os.environ["RANK"]) * x

def boom():
    if os.environ["RANK"] == "3":
        raise KeyError("defined in a cell")
    time.sleep(30)

def forever():
    time.sleep(60)
"""


def test_notebook_functions_run_on_every_node_with_labelled_output_and_cell_tracebacks(tmp_path) -> None:
    with running_kernel({"NBACCEL_LOG_DIR": str(tmp_path)}) as kernel:
        assert kernel.execute(SETUP, timeout=90).stdout.strip().endswith("2 nodes")
        assert kernel.execute(DEFINE).status == "ok"
        run = kernel.execute("print(notebook_launcher(where, (10,), cluster=cluster))")
        assert run.status == "ok", run.error
        for rank in range(4):
            assert f"[rank {rank}] rank {rank} on node {rank // 2}, world 4" in run.stdout
        assert run.stdout.strip().endswith("[0, 10, 20, 30]")
        shown = kernel.execute("notebook_launcher(where, (1,), cluster=cluster, output='widgets');")
        assert shown.status == "ok" and shown.of_type("comm_open"), "the remote ranks' output went to widgets"
        logs = sorted(tmp_path.glob("*/rank3.log"))  # the kernel's per-launch log folder, remote ranks too
        assert logs and "rank 3 on node 1, world 4" in logs[-1].read_text()
        failed = kernel.execute("notebook_launcher(boom, cluster=cluster)")
        assert failed.error is not None and failed.error["ename"] == "NodeRankFailedError"
        text = "\n".join(failed.error["traceback"])
        assert "rank 3 on node 1 (" in text and "KeyError: 'defined in a cell'" in text and "Cell In[" in text and 'raise KeyError("defined in a cell")' in text
        interrupted = kernel.execute("notebook_launcher(forever, cluster=cluster)", interrupt_after=1.5, timeout=30)
        assert interrupted.error is not None and interrupted.error["ename"] == "KeyboardInterrupt"
        assert interrupted.elapsed < 1.5 + 5.0
        assert kernel.execute("print(notebook_launcher(lambda: 'again', cluster=cluster))").stdout.strip().endswith("['again', 'again', 'again', 'again']")
        kernel.execute("%load_ext nbaccel")
        cell = kernel.execute("%%distributed --cluster cluster --text\nprint('node', os.environ['NODE_RANK'])\nint(os.environ['RANK']) * 2")
        assert cell.status == "ok", cell.error
        assert "[rank 3] node 1" in cell.stdout and cell.of_type("execute_result")[0]["content"]["data"]["text/plain"] == "0"
        misuse = kernel.execute("%%distributed --cluster nowhere\n1")
        assert "UsageError" in misuse.stderr and "not an nbaccel.Cluster" in misuse.stderr  # one line, no traceback
        started = kernel.execute("%distributed start --cluster cluster")
        assert started.status == "ok" and "4 workers" in started.stdout, started.stdout + started.stderr
        # A node's namespace starts empty (it cannot inherit the notebook's): the cell imports os.
        assert kernel.execute("%%distributed\nimport os\nremembered = int(os.environ['RANK']) * 3").status == "ok"
        kept = kernel.execute("%%distributed -o kept\nremembered")
        assert kept.status == "ok" and kernel.execute("print(kept)").stdout.strip() == "[0, 3, 6, 9]"
        assert kernel.execute("%distributed stop").status == "ok"
        pids = kernel.execute("print(*[a.pid for a in agents])").stdout.split()
        closed = kernel.execute("cluster.close(); print([a.wait(10) for a in agents])")
        assert closed.stdout.strip() == "[0, 0]"
        assert not any(alive(int(pid)) for pid in pids)
