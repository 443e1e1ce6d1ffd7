"""How the ranks start in each state of the kernel: fork, fork with one thread, spawn, or refuse.

The hazards come from the real detectors elsewhere (tests/devices, the OpenMP test below and the
kernel tier); here each state is set by hand so every decision is checked on every run.

Imports internals (launch, launch.starters.fork, launch.preflight, launch.starters.spawn): it tests those units directly, below the public face.
"""

from __future__ import annotations

import pytest

from nbaccel import PreflightError
from nbaccel.launch import plan as plan_module
from nbaccel.launch.preflight import Hazard, fork_hazards, never_fork
from nbaccel.launch.starters import fork_server
from nbaccel.launch.starters.fork import ForkStarter
from nbaccel.launch.starters.spawn import SpawnStarter

CUDA = Hazard("cuda", "CUDA is already initialised in this kernel")
GROUP = Hazard("process_group", "a torch.distributed process group is already initialised in this kernel")
OPENMP = Hazard("openmp", "this kernel ran a multi-threaded CPU op")


def decide(monkeypatch: pytest.MonkeyPatch, hazards: list, start_method: str, cores: int = 8, server: str = "off") -> object:
    monkeypatch.setenv("NBACCEL_FORK_SERVER", server)  # "off": the routing without a fork server (spawn, one thread)
    monkeypatch.setattr(plan_module, "fork_hazards", lambda: hazards)
    monkeypatch.setattr(plan_module, "threads_per_rank", lambda ranks: max(1, cores // ranks))
    return plan_module.choose_starter(start_method, local_ranks=2)


def test_a_clean_kernel_forks(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    starter = decide(monkeypatch, [], "auto")
    assert isinstance(starter, ForkStarter) and not starter.one_thread
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("hazard", [CUDA, GROUP, "a plain reason string"], ids=["cuda", "process_group", "untyped"])
def test_what_no_fork_survives_spawns_with_a_notice_or_is_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], hazard: str) -> None:
    assert isinstance(decide(monkeypatch, [hazard], "auto"), SpawnStarter)
    assert capsys.readouterr().out == f"nbaccel: {hazard}; starting the ranks with spawn instead of fork (slower).\n"
    with pytest.raises(PreflightError, match="cannot fork the ranks: " + str(hazard)):
        decide(monkeypatch, [hazard], "fork")
    assert isinstance(decide(monkeypatch, [hazard], "spawn"), SpawnStarter)


def test_the_openmp_pool_forks_with_one_thread_per_rank_and_says_so(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for method in ("auto", "fork"):
        starter = decide(monkeypatch, [OPENMP], method)
        assert isinstance(starter, ForkStarter) and starter.one_thread
        out = capsys.readouterr().out
        assert out.count("\n") == 1 and "each rank runs with one CPU thread" in out
    assert isinstance(decide(monkeypatch, [OPENMP], "spawn"), SpawnStarter)


def test_one_thread_is_not_announced_where_ranks_get_one_anyway(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    starter = decide(monkeypatch, [OPENMP], "auto", cores=2)  # 2 ranks on 2 cores: one thread each anyway
    assert isinstance(starter, ForkStarter) and starter.one_thread
    assert capsys.readouterr().out == ""


def test_cuda_outranks_the_openmp_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(decide(monkeypatch, [OPENMP, CUDA], "auto"), SpawnStarter)
    assert never_fork([OPENMP, CUDA]) == [CUDA]


def test_hazards_are_still_reason_strings() -> None:
    assert isinstance(CUDA, str) and CUDA == "CUDA is already initialised in this kernel" and CUDA.kind == "cuda"
    assert all(isinstance(h, str) for h in fork_hazards())


@pytest.fixture
def running_server() -> object:
    fork_server.start_early()
    server = fork_server.running_server() or fork_server.fork_server()
    yield server
    fork_server.shutdown()


@pytest.mark.parametrize("hazard", [CUDA, GROUP], ids=["cuda", "process_group"])
def test_what_no_fork_survives_starts_from_the_fork_server_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], running_server, hazard: str
) -> None:
    assert isinstance(decide(monkeypatch, [hazard], "auto", server="eager"), fork_server.ServerStarter)
    assert f"nbaccel: {hazard}; starting the ranks from nbaccel's fork server (" in capsys.readouterr().out


def test_the_openmp_pool_starts_from_a_running_fork_server_else_one_thread(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], running_server
) -> None:
    assert isinstance(decide(monkeypatch, [OPENMP], "auto", server="eager"), fork_server.ServerStarter)
    assert "starting the ranks from nbaccel's fork server" in capsys.readouterr().out
    starter = decide(monkeypatch, [OPENMP], "fork", server="eager")  # fork asked for: one thread
    assert isinstance(starter, ForkStarter) and starter.one_thread
