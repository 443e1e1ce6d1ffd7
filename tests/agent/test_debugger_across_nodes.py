"""pdb on a rank of another node: its prompt and what pdb prints travel over the agent's signed link.

Two agents on loopback (tests/agent/conftest.py), 2 ranks each; the kernel's stdin is stood in for
by a scripted one (tests/launch/test_debugger.py), the real one is in tests/kernel.
"""

from __future__ import annotations

import os

import pytest

from nbaccel import Cluster, NodeRankFailedError, notebook_launcher, start_workers
from nbaccel.testing import CollectingSink
from tests.launch.test_debugger import ScriptedStdin, stdin  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(90)


def _stop_on_rank_three() -> int:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    secret = int(os.environ["RANK"]) * 100
    if dist.get_rank() == 3:
        breakpoint()
    total = torch.tensor([secret])
    dist.all_reduce(total)  # the others wait here for rank 3
    return int(total.item())


def test_a_breakpoint_on_a_rank_of_the_second_node_prompts_here(two_nodes: Cluster, stdin) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    scripted: ScriptedStdin = stdin(["p secret", "secret = 1000", "c"])
    sink = CollectingSink()
    assert notebook_launcher(_stop_on_rank_three, cluster=two_nodes, output=sink) == [1300] * 4
    assert scripted.prompts[0].startswith("nbaccel: rank 3 is at a breakpoint")
    assert scripted.prompts[0].endswith("(Pdb) rank 3> ")
    assert scripted.prompts[1] == "300\n(Pdb) rank 3> "
    assert "300" in sink.text(3)  # what pdb printed reached rank 3's view


def _raise_on_rank_two() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 2:
        local = "node two"
        raise RuntimeError(local)
    dist.all_reduce(torch.ones(1))


def test_post_mortem_on_a_remote_rank(two_nodes: Cluster, stdin) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    scripted: ScriptedStdin = stdin(["p local", "q"])
    with pytest.raises(NodeRankFailedError, match="rank 2 .*failed: RuntimeError: node two") as caught:
        notebook_launcher(_raise_on_rank_two, cluster=two_nodes, pdb=True, output=CollectingSink())
    assert scripted.prompts[0].startswith("nbaccel: rank 2 raised RuntimeError: node two; post-mortem")
    assert scripted.prompts[1].startswith("'node two'\n")
    assert "rank 0: in `dist.all_reduce`" in str(caught.value)


def _stop_on_rank_three_of_the_workers() -> int:
    import torch
    import torch.distributed as dist

    kept = int(os.environ["RANK"]) * 100
    if dist.get_rank() == 3:
        breakpoint()
    total = torch.tensor([kept])
    dist.all_reduce(total)  # the workers' one group: the others wait here for rank 3
    return int(total.item())


def _quit_on_rank_three_of_the_workers() -> None:
    if os.environ["RANK"] == "3":
        breakpoint()  # no collective after it: peers in one would not stop for the failure (docs/workers.md)


def _fail_on_rank_two_of_the_workers() -> None:
    if os.environ["RANK"] == "2":
        remote = "kept on node one"
        raise KeyError(remote)


def test_breakpoints_and_post_mortem_on_persistent_workers_of_the_second_node(two_nodes: Cluster, stdin) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    scripted: ScriptedStdin = stdin(["p kept", "kept = 1000", "c", "q", "p remote", "q"])
    with start_workers(cluster=two_nodes) as pool:
        sink = CollectingSink()
        assert pool.run(_stop_on_rank_three_of_the_workers, output=sink) == [1300] * 4
        assert scripted.prompts[0].startswith("nbaccel: rank 3 is at a breakpoint") and scripted.prompts[1] == "300\n(Pdb) rank 3> "
        assert "300" in sink.text(3)
        with pytest.raises(NodeRankFailedError, match="rank 3 on node 1 .*failed: BdbQuit: quit in the debugger"):
            pool.run(_quit_on_rank_three_of_the_workers, output=CollectingSink())
        assert scripted.prompts[3].endswith("(Pdb) rank 3> ")
        with pytest.raises(NodeRankFailedError, match="rank 2 on node 1 .*failed: KeyError"):
            pool.run(_fail_on_rank_two_of_the_workers, output=CollectingSink())
        pool.debug(output=CollectingSink())  # the last failure's frames, kept on the remote worker
        assert scripted.prompts[4].startswith("nbaccel: rank 2 raised KeyError: 'kept on node one'; post-mortem")
        assert scripted.prompts[5].startswith("'kept on node one'\n")
        assert scripted.lines == []
        assert pool.run(lambda: "still here", output=CollectingSink()) == ["still here"] * 4  # q failed a task, not the pool
