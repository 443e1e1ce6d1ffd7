"""``nbaccel.plan()`` and ``%distributed plan``: what a launch would do, with nothing started, and
the same reasons as the notices of the real launch that follows.

Imports internals (launch.preview, launch.plan, devices.inventory): the tests make the kernel look
unsafe and the machine have GPUs (stand-ins for what NVML would answer).
"""

from __future__ import annotations

import os
import socket

import pytest

import nbaccel
from nbaccel.devices.inventory import Device, Inventory, Occupant
from nbaccel.launch import plan as planning
from nbaccel.launch import preview as preview_module
from nbaccel.launch.starters import fork_server
from nbaccel.testing import mark_fork_safe, mark_not_fork_safe


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> int:
        raise AssertionError("nbaccel.plan started something")

    monkeypatch.setattr(os, "fork", refuse)
    monkeypatch.setattr(os, "posix_spawn", refuse)
    monkeypatch.setattr(socket.socket, "bind", refuse)


def test_a_cpu_plan_names_ranks_devices_backend_start_and_environment(nothing_starts: None, capsys: pytest.CaptureFixture[str]) -> None:
    preview = nbaccel.plan(num_processes=2, cpu=True, mixed_precision="bf16")
    assert isinstance(preview, nbaccel.LaunchPreview)
    assert (preview.num_processes, preview.device_type, preview.backend, preview.start_method) == (2, "cpu", "gloo", "fork")
    assert [(r.rank, r.local_rank, r.device, r.gpu) for r in preview.ranks] == [(0, 0, "cpu", None), (1, 1, "cpu", None)]
    assert preview.ranks[1].environment["RANK"] == "1" and preview.ranks[1].environment["ACCELERATE_MIXED_PRECISION"] == "bf16"
    assert preview.ranks[0].environment["MASTER_PORT"] == preview_module.FREE_PORT
    assert "fork-safe" in preview.start_reason and preview.hazards == ()
    text = str(preview)
    assert text.startswith("nbaccel plan: 2 rank(s) on cpu, backend gloo, mixed precision bf16\nstart: fork: this kernel is fork-safe")
    assert "  GLOO_SOCKET_IFNAME=lo" in text and "environment of rank 1: LOCAL_RANK=1 RANK=1 ROLE_RANK=1" in text
    assert text.endswith("(nothing was started)")
    assert capsys.readouterr().out == ""  # no notice printed: they are in the preview


def nvidia_gpus(count: int) -> Inventory:
    return Inventory("cuda", "nvidia", tuple(Device(i, "NVIDIA H200", i) for i in range(count)))


def test_the_default_cpu_launch_notice_is_kept_not_printed(nothing_starts: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(planning, "gpu_inventory", lambda: Inventory("cpu", ""))
    preview = nbaccel.plan()
    assert preview.notices == ("no GPU visible; launching 2 CPU processes on gloo.",)
    assert "a launch would say: nbaccel: no GPU visible; launching 2 CPU processes on gloo." in str(preview)
    assert capsys.readouterr().out == ""


def test_gpu_ranks_name_their_gpu(nothing_starts: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(planning, "gpu_inventory", lambda: nvidia_gpus(4))
    monkeypatch.setattr(planning, "occupants", lambda found: {})
    monkeypatch.setattr(planning, "nccl_guard", lambda gpus: None)
    preview = nbaccel.plan(gpus=[1, 3])
    assert (preview.device_type, preview.backend) == ("cuda", "nccl")
    assert [(r.device, r.gpu, r.environment["CUDA_VISIBLE_DEVICES"]) for r in preview.ranks] == [("cuda:0", 1, "1,3"), ("cuda:1", 3, "1,3")]
    assert "rank 1: cuda:1 (GPU 3 of this kernel)" in str(preview)


def test_a_busy_gpu_is_skipped_and_the_plan_says_why(nothing_starts: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(planning, "gpu_inventory", lambda: nvidia_gpus(3))
    monkeypatch.setattr(
        planning, "occupants", lambda found: {0: Occupant(pids={4242: 38 * 2**30}, unlisted=None, total=None)} if found.devices[0].index == 0 else {}
    )
    monkeypatch.setattr(planning, "nccl_guard", lambda gpus: None)
    preview = nbaccel.plan()
    assert [r.gpu for r in preview.ranks] == [1, 2]
    [note] = preview.device_notes
    assert note.startswith("GPU 0: 38.0 GiB used by pid 4242, so it is skipped")
    assert preview.notices[0] == note  # what the launch would say, in its words
    assert f"devices: {note}" in str(preview) and capsys.readouterr().out == ""


def test_bad_arguments_are_refused_as_the_launch_refuses_them(nothing_starts: None) -> None:
    with pytest.raises(ValueError, match="num_nodes must be"):
        nbaccel.plan(num_nodes=0)
    with pytest.raises(ValueError, match="unknown output 'html'"):
        nbaccel.plan(output="html")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="function must be callable"):
        nbaccel.plan(42)  # type: ignore[arg-type]


def test_a_node_of_a_multi_node_launch(nothing_starts: None) -> None:
    preview = nbaccel.plan(None, (), 2, "no", "29501", "127.0.0.1", 1, 2, cpu=True)
    assert [r.rank for r in preview.ranks] == [2, 3]
    assert preview.ranks[0].environment["WORLD_SIZE"] == "4" and preview.ranks[0].environment["MASTER_PORT"] == "29501"
    assert "node 0's kernel serves a store bound to 127.0.0.1:29501" in preview.rendezvous


@pytest.mark.timeout(120)
def test_an_unsafe_kernel_plans_the_fork_server_with_the_launchs_own_words(capsys: pytest.CaptureFixture[str]) -> None:
    fork_server.shutdown()
    server = fork_server.fork_server()
    mark_not_fork_safe("CUDA is initialised (pretend)")
    try:
        preview = nbaccel.plan(num_processes=2, cpu=True)
        assert preview.start_method == "forkserver" and preview.hazards == ("CUDA is initialised (pretend)",)
        assert capsys.readouterr().out == ""
        nbaccel.notebook_launcher(int, num_processes=2, cpu=True, output="text")
        said = [line.removeprefix("nbaccel: ") for line in capsys.readouterr().out.splitlines() if line.startswith("nbaccel: ")]
        assert (
            said
            == list(preview.notices)
            == ["CUDA is initialised (pretend); starting the ranks from nbaccel's fork server (forked from this kernel before it became unsafe)."]
        )
        assert server.alive()
    finally:
        mark_fork_safe()
        fork_server.shutdown()


def test_fork_refused_in_an_unsafe_kernel_is_refused_by_the_plan_too() -> None:
    mark_not_fork_safe("CUDA is initialised (pretend)")
    try:
        with pytest.raises(nbaccel.PreflightError, match="cannot fork the ranks: CUDA is initialised"):
            nbaccel.plan(num_processes=2, start_method="fork")
    finally:
        mark_fork_safe()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_cluster_plan_counts_every_nodes_ranks() -> None:
    from tests.agent.harness import start_agents, stop_agents

    with nbaccel.Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=2, nproc=1)
        try:
            cluster.wait(nodes=2, timeout=60)
            preview = nbaccel.plan(cluster=cluster, cpu=True)
        finally:
            cluster.close()
            stop_agents(agents)
    assert (preview.num_processes, preview.start_method, preview.backend) == (2, "agents", "gloo")
    assert preview.start_reason.startswith("each node's agent forks its own ranks (node 0 (") and preview.start_reason.endswith(": 1 rank(s))")


def _parameters(function: object) -> list[tuple[str, str, object, object]]:
    import inspect

    return [(p.name, p.kind.name, p.default, p.annotation) for p in inspect.signature(function).parameters.values()]  # type: ignore[arg-type]


def test_plan_takes_every_parameter_of_notebook_launcher_as_it_is() -> None:
    """``nbaccel.plan()`` mirrors ``notebook_launcher``'s signature by hand (both are public, each
    with its own docstring): names, order, kinds, defaults and annotations must not drift. Only
    ``function`` differs, as it must: a plan may be asked without one (default None)."""
    ours, theirs = _parameters(nbaccel.plan), _parameters(nbaccel.notebook_launcher)
    assert [p[:2] for p in ours] == [p[:2] for p in theirs], "plan() and notebook_launcher() take different parameters (names, order or kinds)"
    assert ours[0] == ("function", "POSITIONAL_OR_KEYWORD", None, "Callable[..., Any] | None"), ours[0]
    assert theirs[0][3] == "Callable[..., T]", theirs[0]
    drifted = [(mine, launcher) for mine, launcher in zip(ours[1:], theirs[1:], strict=True) if mine != launcher]
    assert not drifted, f"plan() differs from notebook_launcher() in: {drifted}"
