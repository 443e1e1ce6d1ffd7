"""Accelerate's multi-node workflow in real kernels: two notebooks on this machine, each calling
``notebook_launcher(..., num_nodes=2, node_rank=R, master_addr=..., use_port=...)`` with a function
defined in the notebook, form one world (a gloo all_reduce across both sees every rank)."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest

from nbaccel.testing import scaled
from tests.kernel_harness import running_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.slow, pytest.mark.timeout(240)]

CELL = """
import os
from nbaccel import notebook_launcher

def training_function(scale):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    total = torch.ones(1) * (dist.get_rank() + 1) * scale
    dist.all_reduce(total)
    print(f"world {{dist.get_world_size()}}")
    return dist.get_rank(), dist.get_world_size(), total.item(), os.environ["NODE_RANK"]

print("VALUES", notebook_launcher(training_function, (10,), num_processes=2, num_nodes=2, node_rank={node_rank}, master_addr="127.0.0.1", use_port="{port}"))
"""


def finish(client: Any, msg_id: str, timeout: float) -> tuple[str, str]:
    """The stdout of the cell ``msg_id`` (sent without waiting) and its status, once the kernel is idle."""
    deadline, out = time.monotonic() + scaled(timeout), ""
    while time.monotonic() < deadline:
        msg = client.get_iopub_msg(timeout=max(0.01, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out += msg["content"]["text"]
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            reply = client.get_shell_msg(timeout=scaled(10))
            return out, str(reply["content"]["status"])
    raise TimeoutError("the node's cell did not finish")


def test_two_notebooks_on_one_machine_form_one_world() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    outs: dict[int, tuple[str, str]] = {}
    with running_kernel() as node0, running_kernel() as node1:
        # both cells run at once, as two people would run them; one client thread drives both
        sent = node1.client.execute(CELL.format(node_rank=1, port=port))
        done = node0.execute(CELL.format(node_rank=0, port=port), timeout=180)
        outs[0] = done.stdout, str(done.status)
        outs[1] = finish(node1.client, sent, 180)
    for node_rank, first in ((0, 0), (1, 2)):
        out, status = outs[node_rank]
        assert status == "ok", out
        assert f"VALUES [({first}, 4, 100.0, '{node_rank}'), ({first + 1}, 4, 100.0, '{node_rank}')]" in out, out
        assert f"[rank {first + 1}] world 4" in out  # text lines are labelled with global ranks
        assert f"nbaccel: node {node_rank} of 2 met the others at 127.0.0.1:{port}: ranks {first}..{first + 1} of 4 run here" in out
