"""Accelerate 1.x's whole ``notebook_launcher`` signature: calls written for Accelerate run unchanged,
and its multi-node notebooks (one per node, ``num_nodes=2, node_rank=R``) form one world.

The nodes are two Python processes on this machine, each calling ``notebook_launcher`` as a node's
notebook would (real forks, a real store, a real gloo process group across both).
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import nbaccel
from nbaccel.testing import scaled

ACCELERATE_ORDER = [
    ("function", inspect.Parameter.empty),
    ("args", ()),
    ("num_processes", None),
    ("mixed_precision", "no"),
    ("use_port", None),  # Accelerate's "29500": on one node nbaccel picks a free port (docs/launcher.md)
    ("master_addr", "127.0.0.1"),
    ("node_rank", 0),
    ("num_nodes", 1),
    ("rdzv_backend", "static"),
    ("rdzv_endpoint", ""),
    ("rdzv_conf", None),
    ("rdzv_id", "none"),
    ("max_restarts", 0),
    ("monitor_interval", 0.1),
    ("log_line_prefix_template", None),
]


def rank_world_sum() -> tuple[int, int, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1) * (dist.get_rank() + 1)
    dist.all_reduce(total)
    return dist.get_rank(), dist.get_world_size(), total.item()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_positional_parameters_are_accelerates_in_its_order() -> None:
    parameters = list(inspect.signature(nbaccel.notebook_launcher).parameters.values())
    positional = [(p.name, p.default) for p in parameters if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert positional == ACCELERATE_ORDER
    keywords = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert keywords >= {"start_method", "timeout", "gpus", "cpu", "output", "stall_report", "cluster", "pdb", "profile"}


def test_the_names_and_order_are_those_of_the_installed_accelerate() -> None:
    accelerate = pytest.importorskip("accelerate")
    theirs = [(p.name, p.default) for p in inspect.signature(accelerate.notebook_launcher).parameters.values()]
    ours = [(p.name, p.default) for p in inspect.signature(nbaccel.notebook_launcher).parameters.values()][: len(theirs)]
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    differing = {name: (mine, default) for (name, mine), (_, default) in zip(ours, theirs, strict=True) if mine != default}
    assert differing == {"use_port": (None, "29500")}  # one node: a free port each launch (docs/launcher.md says why)


@pytest.mark.timeout(90)
def test_accelerates_documented_calls_run_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    port = str(free_port())  # Accelerate passes the port as a string
    assert nbaccel.notebook_launcher(rank_world_sum, (), 2) == [(0, 2, 3.0), (1, 2, 3.0)]
    assert nbaccel.notebook_launcher(rank_world_sum, args=(), num_processes=2, mixed_precision="no", use_port=port)[1] == (1, 2, 3.0)
    # every parameter of Accelerate's signature, positionally, at its documented value
    every = (rank_world_sum, (), 2, "no", port, "127.0.0.1", 0, 1, "static", "", None, "none", 0, 0.1, None)
    assert nbaccel.notebook_launcher(*every) == [(0, 2, 3.0), (1, 2, 3.0)]
    # and by keyword, a prefix template of torch elastic's macros
    values = nbaccel.notebook_launcher(
        function=rank_world_sum,
        args=(),
        num_processes=2,
        mixed_precision="no",
        use_port=port,
        master_addr="127.0.0.1",
        node_rank=0,
        num_nodes=1,
        rdzv_backend="static",
        rdzv_endpoint="",
        rdzv_conf=None,
        rdzv_id="none",
        max_restarts=0,
        monitor_interval=0.5,
        log_line_prefix_template="[${role_name}${rank}|${local_rank}]:",
        output="text",
    )
    assert values == [(0, 2, 3.0), (1, 2, 3.0)]


def say_hello() -> None:
    print("hello")


def test_the_prefix_template_labels_every_text_line(capsys: pytest.CaptureFixture[str]) -> None:
    nbaccel.notebook_launcher(say_hello, num_processes=2, log_line_prefix_template="${role_name}-${rank}/${local_rank} $other| ", output="text")
    lines = sorted(line for line in capsys.readouterr().out.splitlines() if "hello" in line)
    assert lines == ["default-0/0 $other| hello", "default-1/1 $other| hello"]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_nodes": 0}, ValueError, "num_nodes must be a whole number >= 1"),
        ({"num_nodes": 2, "node_rank": 2}, ValueError, r"node_rank must be a whole number from 0 to num_nodes - 1 = 1.*got 2"),
        ({"node_rank": -1}, ValueError, "node_rank must be"),
        ({"num_nodes": 2, "rdzv_backend": "etcd"}, ValueError, r"unknown rdzv_backend 'etcd'; choose one of 'static', 'c10d'"),
        ({"num_nodes": 2, "rdzv_endpoint": "host:http"}, ValueError, "rdzv_endpoint must be 'HOST:PORT'"),
        ({"num_nodes": 2, "rdzv_conf": {"flavour": 1}}, ValueError, r"rdzv_conf has unknown key\(s\) \['flavour'\]"),
        ({"num_nodes": 2, "rdzv_conf": {"join_timeout": -1}}, ValueError, r"rdzv_conf\['join_timeout'\] must be a positive number"),
        ({"rdzv_id": ""}, ValueError, "rdzv_id must be a non-empty string"),
        ({"monitor_interval": 0}, ValueError, "monitor_interval must be a positive number"),
        ({"log_line_prefix_template": 3}, TypeError, "log_line_prefix_template must be a string"),
        ({"num_nodes": 2, "max_restarts": 1}, ValueError, "cannot restart their ranks together.*cluster="),
        ({"master_addr": "10.1.2.3"}, ValueError, "not a loopback address.*num_nodes=N"),
        ({"num_nodes": 2, "cluster": object()}, ValueError, "cluster= and num_nodes=2 are two ways"),
    ],
)
def test_bad_node_values_are_refused_before_anything_starts(monkeypatch: pytest.MonkeyPatch, kwargs: dict, error: type, match: str) -> None:
    def refuse(*args: object, **kw: object) -> int:
        raise AssertionError("the launcher started something although the arguments were invalid")

    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    monkeypatch.setattr(socket.socket, "bind", refuse)
    with pytest.raises(error, match=match):
        nbaccel.notebook_launcher(rank_world_sum, num_processes=2, **kwargs)


# -- two nodes: two processes, each a node's notebook ----------------------------------------------

NODE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import nbaccel
    sys.path.insert(0, {tests!r})
    from tests.launch.test_accelerate_signature import {function}
    kwargs = json.loads(sys.argv[1])
    try:
        print("VALUES", json.dumps(nbaccel.notebook_launcher({function}, (), **kwargs)), flush=True)
    except Exception as exc:
        print("ERROR", type(exc).__name__, exc, flush=True)
    """
)


def start_node(function: str, **kwargs: object) -> subprocess.Popen[str]:
    import json

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    script = NODE_SCRIPT.format(tests=root, function=function)
    return subprocess.Popen(
        [sys.executable, "-c", script, json.dumps({"output": "text", **kwargs})], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def finish(node: subprocess.Popen[str], timeout: float = 90.0) -> str:
    try:
        out, _ = node.communicate(timeout=scaled(timeout))
    except subprocess.TimeoutExpired:
        node.kill()
        out, _ = node.communicate()
        pytest.fail(f"a node did not finish:\n{out}")
    return out


def values_of(out: str) -> list[list[float]]:
    import json

    line = next((line for line in out.splitlines() if line.startswith("VALUES ")), None)
    assert line is not None, out
    return list(json.loads(line[len("VALUES ") :]))


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.parametrize("backend", ["static", "c10d"])
def test_two_nodes_notebooks_form_one_world(backend: str) -> None:
    port = free_port()
    nodes = [
        start_node(
            "rank_world_sum",
            num_processes=2,
            use_port=str(port),
            master_addr="127.0.0.1",
            node_rank=rank,
            num_nodes=2,
            rdzv_backend=backend,
            log_line_prefix_template="[${rank}/${local_rank}] ",
        )
        for rank in (1, 0)
    ]
    outs = [finish(node) for node in nodes]
    values = sorted(tuple(value) for out in outs for value in values_of(out))
    assert values == [(0, 4, 10.0), (1, 4, 10.0), (2, 4, 10.0), (3, 4, 10.0)]
    for out in outs:  # each call returns its own ranks, in global rank order
        mine = [tuple(v) for v in values_of(out)]
        assert mine in ([(0, 4, 10.0), (1, 4, 10.0)], [(2, 4, 10.0), (3, 4, 10.0)]), out
        first = int(mine[0][0])
        assert f"ranks {first}..{first + 1} of 4 run here" in out


def accelerator_world() -> tuple[int, int, int, bool, float]:
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    total = accelerator.reduce(torch.ones(1) * (accelerator.process_index + 1), reduction="sum")
    return accelerator.process_index, accelerator.num_processes, accelerator.local_process_index, accelerator.is_local_main_process, total.item()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_accelerates_accelerator_sees_the_whole_world_of_two_nodes() -> None:
    pytest.importorskip("accelerate")
    port = free_port()
    nodes = [start_node("accelerator_world", num_processes=2, use_port=str(port), node_rank=rank, num_nodes=2) for rank in (0, 1)]
    node0, node1 = (values_of(finish(node)) for node in nodes)
    assert node0 == [[0, 4, 0, True, 10.0], [1, 4, 1, False, 10.0]]
    assert node1 == [[2, 4, 0, True, 10.0], [3, 4, 1, False, 10.0]]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_nodes_may_start_their_ranks_by_the_fork_server_or_spawn() -> None:
    port = free_port()
    common = {"num_processes": 1, "use_port": port, "num_nodes": 2}
    nodes = [
        start_node("rank_world_sum", node_rank=0, start_method="forkserver", **common),
        start_node("rank_world_sum", node_rank=1, start_method="spawn", **common),
    ]
    assert [values_of(finish(node)) for node in nodes] == [[[0, 2, 3.0]], [[1, 2, 3.0]]]


def fail_on_rank_three() -> int:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if rank == 3:
        raise RuntimeError("rank three fails")
    dist.barrier()
    return rank


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_store_listens_on_master_addr_only_and_a_failed_launch_leaves_no_stale_store() -> None:
    port = free_port()
    common = {"num_processes": 1, "use_port": port, "master_addr": "127.0.0.2", "num_nodes": 2}
    node0 = start_node("fail_on_rank_three", node_rank=0, **common)
    try:
        assert wait_listening(port, timeout=scaled(60)) == "127.0.0.2"  # master_addr, neither 0.0.0.0 nor loopback's 127.0.0.1
    finally:
        node1 = start_node("fail_on_rank_three", node_rank=1, **common)
        outs = [finish(node0), finish(node1)]
    assert all("ERROR" not in out for out in outs), outs  # no rank 3 with one rank a node: both succeed
    # two ranks a node: rank 3 (node 1) fails, so does node 0's rank blocked in the barrier ...
    common["num_processes"] = 2
    nodes = [start_node("fail_on_rank_three", node_rank=rank, **common) for rank in (0, 1)]
    outs = [finish(node) for node in nodes]
    assert "ERROR NodeRankFailedError rank 1 on node 1 of 2 (global rank 3) failed: RuntimeError: rank three fails" in outs[1], outs[1]
    assert "ERROR NodeRankFailedError rank " in outs[0] and "on node 0 of 2" in outs[0], outs[0]  # its peer in the barrier lost rank 3
    # ... and the next launch on the same port meets in a fresh store
    common["num_processes"] = 1
    nodes = [start_node("fail_on_rank_three", node_rank=rank, **common) for rank in (1, 0)]
    assert sorted(v for out in (finish(node) for node in nodes) for v in values_of(out)) == [0, 1]


def wait_listening(port: int, timeout: float) -> str:
    """The address a socket listens on at ``port`` (from /proc/net/tcp), once one does."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                return socket.inet_ntoa(bytes.fromhex(address)[::-1])
        time.sleep(0.05)
    raise AssertionError(f"nothing listened on port {port}")


@pytest.mark.timeout(60)
def test_a_node_that_never_comes_is_named_after_the_join_timeout() -> None:
    with pytest.raises(nbaccel.PreflightError, match=r"node 1 did not join at 127.0.0.1:\d+ within the join timeout.*node_rank=1"):
        nbaccel.notebook_launcher(rank_world_sum, num_processes=1, use_port=free_port(), num_nodes=2, rdzv_conf={"join_timeout": 1})


def rank_once_told() -> int:
    """The rank, once the test created the file NBACCEL_TEST_GO names (the ranks hold the store up till then)."""
    go = Path(os.environ["NBACCEL_TEST_GO"])
    while not go.exists():
        time.sleep(0.05)
    return int(os.environ["RANK"])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_two_nodes_claiming_one_node_rank_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    go = tmp_path / "go"
    monkeypatch.setenv("NBACCEL_TEST_GO", str(go))
    port = free_port()
    common = {"num_processes": 1, "use_port": port, "num_nodes": 2}
    node0 = start_node("rank_once_told", node_rank=0, **common)
    ones = [start_node("rank_once_told", node_rank=1, **common) for _ in range(2)]
    try:  # the second node 1 to claim its rank is refused, whichever it is, while the first one's rank waits
        deadline = time.monotonic() + scaled(60)
        while all(node.poll() is None for node in ones) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        go.touch()
        outs = [finish(node) for node in ones]
    refused = [out for out in outs if "ERROR PreflightError node_rank=1 was claimed by another node too" in out]
    assert len(refused) == 1, outs
    assert values_of(next(out for out in outs if out not in refused)) == [1]
    assert values_of(finish(node0)) == [0]


@pytest.mark.timeout(60)
def test_a_node_whose_node_0_never_comes_is_told_quietly(capfd: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    with pytest.raises(nbaccel.PreflightError, match=rf"node 0's store at 127.0.0.1:{port} did not come up within the join timeout"):
        nbaccel.notebook_launcher(rank_world_sum, num_processes=1, use_port=port, num_nodes=2, node_rank=1, rdzv_conf={"join_timeout": 1})
    assert "frame #" not in capfd.readouterr().err  # no C++ stack from torch's retrying client
