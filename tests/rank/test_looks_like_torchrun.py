"""A rank looks like one torchrun started, to code written for torchrun (issue 16), on 2 real ranks.

torchrun's worker environment is read off a real ``torchrun --nproc-per-node 2`` (the venv's),
not copied from its source: a torch that adds a variable fails the comparison.

Imports internals (output.sinks, wire.rank_env): it tests those units directly, below the public face.
"""

from __future__ import annotations

import atexit
import builtins
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import nbaccel
from nbaccel.testing import scaled
from nbaccel.wire.rank_env import TORCHRUN_VARIABLES

TORCHRUN = Path(sys.executable).with_name("torchrun")

DUMP_ENV = """
import json, os, sys
added = {k: v for k, v in os.environ.items() if os.environ.get("PARENT_" + k) != v and not k.startswith("PARENT_")}
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as out:
    json.dump(added, out)
"""

# What torchrun gives its workers that nbaccel does not, and why (docs/launcher.md).
NOT_GIVEN = {
    "TORCHELASTIC_ERROR_FILE",  # errors travel on the rank's channel
    "TORCHELASTIC_SIGNALS_TO_HANDLE",  # set on the agent, for the agent's own signal handling
    "PYTHONUNBUFFERED",  # not torchrun's: the test's own
}


def torchrun_environment(tmp_path: Path) -> dict[int, dict[str, str]]:
    """What torchrun adds to each of its 2 workers' environments."""
    script = tmp_path / "dump_env.py"
    script.write_text(DUMP_ENV)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "TORCHELASTIC", "MASTER_"))}
    env.update({f"PARENT_{k}": v for k, v in env.items()})
    subprocess.run([str(TORCHRUN), "--nproc-per-node", "2", str(script), str(tmp_path)], env=env, check=True, timeout=scaled(120), capture_output=True)
    return {rank: json.loads((tmp_path / str(rank)).read_text()) for rank in (0, 1)}


def environment_and_shell() -> dict[str, Any]:
    import torch.distributed as dist

    return {
        "env": dict(os.environ),
        "elastic": dist.is_torchelastic_launched(),
        "ps1": hasattr(sys, "ps1") or hasattr(sys, "ps2"),
        "builtins": sorted(name for name in ("get_ipython", "__IPYTHON__") if hasattr(builtins, name)),
        "flag": sys.modules["lightning_fabric.nbaccel_probe"]._IS_INTERACTIVE,
    }


@pytest.fixture
def interactive_kernel_look(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """This process made to look like ipykernel's: prompts, and a Lightning flag frozen at import."""
    monkeypatch.setattr(sys, "ps1", "In : ", raising=False)
    monkeypatch.setattr(sys, "ps2", "...: ", raising=False)
    probe = types.ModuleType("lightning_fabric.nbaccel_probe")
    probe._IS_INTERACTIVE = True  # type: ignore[attr-defined]  # as lightning computes it in a kernel
    monkeypatch.setitem(sys.modules, "lightning_fabric.nbaccel_probe", probe)
    if "lightning_fabric" not in sys.modules:  # the real package is in tests/kernel/test_lightning_kernel.py
        monkeypatch.setitem(sys.modules, "lightning_fabric", types.ModuleType("lightning_fabric"))
    yield


@pytest.mark.slow
def test_a_rank_has_torchruns_whole_worker_environment_and_no_interactive_shell(tmp_path: Path, interactive_kernel_look: None) -> None:
    by_torchrun = torchrun_environment(tmp_path)
    ranks = nbaccel.notebook_launcher(environment_and_shell, num_processes=2, output="text", timeout=scaled(60))
    for rank, seen in enumerate(ranks):
        torchrun_names = set(by_torchrun[rank]) - NOT_GIVEN
        assert torchrun_names - set(seen["env"]) == set()
        assert set(TORCHRUN_VARIABLES) <= torchrun_names | {"TORCHELASTIC_USE_AGENT_STORE"}  # the list in rank_env is torchrun's
        for name in (
            "RANK",
            "LOCAL_RANK",
            "GROUP_RANK",
            "ROLE_RANK",
            "ROLE_NAME",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "ROLE_WORLD_SIZE",
            "GROUP_WORLD_SIZE",
            "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        ):
            assert seen["env"][name] == by_torchrun[rank][name], name
        assert (seen["elastic"], seen["ps1"], seen["builtins"], seen["flag"]) == (True, False, [], False)
    assert ranks[0]["env"]["TORCHELASTIC_RUN_ID"] == ranks[1]["env"]["TORCHELASTIC_RUN_ID"]
    assert sys.ps1 == "In : "  # the kernel keeps its own


def run_id() -> str:
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "1":
        raise RuntimeError("first attempt fails")
    return os.environ["TORCHELASTIC_RUN_ID"]


@pytest.mark.slow
def test_the_run_id_is_one_per_launch_and_kept_across_restarts() -> None:
    first = nbaccel.notebook_launcher(run_id, num_processes=2, max_restarts=1, output="text", timeout=scaled(60))
    again = nbaccel.notebook_launcher(run_id, num_processes=2, max_restarts=1, output="text", timeout=scaled(60))
    assert len(set(first)) == 1 and len(set(again)) == 1 and first != again


def register_writer(namespace: dict[str, Any], folder: str) -> None:
    atexit.register(Path(folder, os.environ["RANK"]).write_text, "closed")  # SummaryWriter.close, say


def test_persistent_workers_run_their_atexit_handlers_when_stopped(tmp_path: Path) -> None:
    with nbaccel.start_workers(2) as workers:
        workers.run_task(lambda namespace: register_writer(namespace, str(tmp_path)), output="text")
        assert list(tmp_path.iterdir()) == []  # not at the end of the cell: at the worker's end
    assert sorted(p.read_text() for p in tmp_path.iterdir()) == ["closed", "closed"]


# Accelerate's own notebook tests (accelerate/test_utils/scripts/test_notebook.py), imported from
# the installed accelerate, run under nbaccel's launcher.
notebook_tests = pytest.importorskip("accelerate.test_utils.scripts.test_notebook")


def test_accelerates_tough_nut_function_cracks_across_max_restarts() -> None:
    """Its count lives in a fork queue each failing rank puts back before it raises: lost (the
    rank's exit dropped the feeder's buffer), no attempt ever cracks it.

    One rank, as its count then says exactly how many attempts it takes (4 for 3 restarts).
    With two, a peer still inside ``queue.get()`` when the other's error stops the launch takes
    the count with it: under torch elastic too, only less often (it notices a failure by the
    exit, 0.1 s polls, nbaccel by the error event).
    """
    import multiprocessing

    from nbaccel.output.sinks import CollectingSink

    q = multiprocessing.get_context("fork").Queue()
    q.put(3)
    sink = CollectingSink()
    try:
        assert nbaccel.notebook_launcher(notebook_tests.tough_nut_function, (q,), num_processes=1, max_restarts=3, output=sink, timeout=scaled(120)) == [None]
        assert any("PartialState:" in line for line in sink.text(0)) and sink.attempts == 4
        assert q.empty()
    finally:
        q.close()
        q.join_thread()


def test_accelerates_basic_and_clean_fork_functions_run_in_every_rank() -> None:
    from nbaccel.output.sinks import CollectingSink

    sink = CollectingSink()
    assert nbaccel.notebook_launcher(notebook_tests.basic_function, num_processes=2, output=sink, timeout=scaled(60)) == [None, None]
    assert all(any("Num processes: 2" in line for line in sink.text(rank)) for rank in (0, 1))
    assert nbaccel.notebook_launcher(notebook_tests.assert_clean_cuda_fork_function, num_processes=2, output="text", timeout=scaled(60)) == [None, None]


def test_accelerates_bipolar_function_fails_at_once_not_after_the_sleep() -> None:
    import time

    started = time.monotonic()
    with pytest.raises(nbaccel.RankFailedError, match="I'm an even process"):
        nbaccel.notebook_launcher(notebook_tests.bipolar_sleep_function, (100,), num_processes=2, output="text", timeout=scaled(60))
    assert time.monotonic() - started < scaled(20)
