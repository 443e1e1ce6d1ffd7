"""Launches on two agents on loopback (each a "node" of 2 ranks): values, environment, output, errors.

Imports internals (output.widgets.sink, wire.rank_env): it tests those units directly, below the public face.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from nbaccel import Cluster, LaunchTimeoutError, NodeRankFailedError, notebook_launcher
from nbaccel.testing import CollectingSink, scaled
from tests.agent.harness import interrupt_main_thread

pytestmark = pytest.mark.timeout(60)


def _all_reduce_rank() -> tuple[int, int]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.tensor([dist.get_rank()])
    dist.all_reduce(total)
    return dist.get_rank(), int(total.item())


def test_values_come_back_in_global_rank_order(two_nodes: Cluster) -> None:
    assert notebook_launcher(_all_reduce_rank, cluster=two_nodes, output=CollectingSink()) == [(r, 6) for r in range(4)]


def _environment() -> dict[str, str]:
    import os

    from nbaccel.wire.rank_env import TORCHRUN_VARIABLES

    names = ("NODE_RANK", "GLOO_SOCKET_IFNAME", *TORCHRUN_VARIABLES)
    return {name: os.environ[name] for name in names}


def test_ranks_see_the_environment_torchrun_sets(two_nodes: Cluster) -> None:
    envs = notebook_launcher(_environment, cluster=two_nodes, output=CollectingSink())
    assert [(e["RANK"], e["LOCAL_RANK"], e["NODE_RANK"], e["GROUP_RANK"]) for e in envs] == [
        ("0", "0", "0", "0"),
        ("1", "1", "0", "0"),
        ("2", "0", "1", "1"),
        ("3", "1", "1", "1"),
    ]
    assert {(e["WORLD_SIZE"], e["LOCAL_WORLD_SIZE"], e["MASTER_ADDR"], e["GLOO_SOCKET_IFNAME"]) for e in envs} == {("4", "2", "127.0.0.1", "lo")}
    assert len({e["MASTER_PORT"] for e in envs}) == 1 and len({e["TORCHELASTIC_RUN_ID"] for e in envs}) == 1
    assert [(e["ROLE_RANK"], e["ROLE_NAME"], e["ROLE_WORLD_SIZE"], e["GROUP_WORLD_SIZE"]) for e in envs] == [(str(r), "default", "4", "2") for r in range(4)]


def _register_exit_file(folder: str) -> int:
    import atexit
    import multiprocessing
    import os
    import pathlib

    atexit.register(pathlib.Path(folder, os.environ["RANK"]).write_text, "closed")
    return len(multiprocessing.active_children())


def test_ranks_on_every_node_run_their_own_atexit_handlers(two_nodes: Cluster, tmp_path: Path) -> None:
    assert notebook_launcher(_register_exit_file, (str(tmp_path),), cluster=two_nodes, output=CollectingSink()) == [0] * 4
    assert sorted(p.name for p in tmp_path.iterdir() if p.read_text() == "closed") == ["0", "1", "2", "3"]


def _state() -> tuple[int, int, int, bool, list[int]]:
    import os

    import nbaccel

    state = nbaccel.PartialState(cpu=True)
    ran = []
    state.on_local_main_process(lambda: ran.append(int(os.environ["NODE_RANK"])))()
    return state.process_index, state.local_process_index, state.num_processes, state.is_local_main_process, ran


def test_partial_state_sees_the_node_layout(two_nodes: Cluster) -> None:
    states = notebook_launcher(_state, cluster=two_nodes, output=CollectingSink())
    assert [s[:4] for s in states] == [(0, 0, 4, True), (1, 1, 4, False), (2, 0, 4, True), (3, 1, 4, False)]
    assert [s[4] for s in states] == [[0], [], [1], []]  # on_local_main_process: once per node


def _chatty() -> None:
    import os
    import sys

    from IPython.display import display

    rank = os.environ["RANK"]
    print(f"out from rank {rank}")
    os.write(1, f"C-level from rank {rank}\n".encode())
    print(f"err from rank {rank}", file=sys.stderr)
    display({"text/plain": f"shown by {rank}"}, raw=True)


def test_remote_output_is_labelled_with_the_global_rank(two_nodes: Cluster) -> None:
    sink = CollectingSink()
    notebook_launcher(_chatty, cluster=two_nodes, output=sink)
    for rank in range(4):
        assert sink.text(rank, "stdout") == [f"out from rank {rank}", f"C-level from rank {rank}"]
        assert sink.text(rank, "stderr") == [f"err from rank {rank}"]
        shown = [e["data"]["text/plain"] for e in sink.events.get(rank, []) if e["type"] == "display"]
        assert shown == [f"shown by {rank}"]


def _fail_on_rank_3() -> None:
    import os
    import time

    import torch.distributed as dist

    dist.init_process_group("gloo")
    if os.environ["RANK"] == "3":
        raise ValueError("rank 3 is unhappy")
    dist.barrier()  # the others wait here: they must be stopped, not blamed
    time.sleep(60)


def test_a_raising_remote_rank_is_the_root_cause_named_with_its_node(two_nodes: Cluster) -> None:
    started = time.monotonic()
    with pytest.raises(NodeRankFailedError) as caught:
        notebook_launcher(_fail_on_rank_3, cluster=two_nodes, output=CollectingSink())
    assert time.monotonic() - started < 8.0
    error = caught.value
    assert error.rank == 3 and error.exc_type == "ValueError"
    assert str(error).startswith("rank 3 on node 1 (") and "rank 3 is unhappy" in str(error)
    assert 'raise ValueError("rank 3 is unhappy")' in error.remote_traceback
    assert error.outcomes[3].status.value == "failed"
    for outcome in error.outcomes[:3]:  # stopped, or failed only with a peer's closed connection
        assert outcome.status.value == "stopped" or (outcome.error is not None and outcome.error.is_peer_error), outcome
    assert notebook_launcher(lambda: "next", cluster=two_nodes, output=CollectingSink()) == ["next"] * 4


def _sleep_long() -> None:
    import time

    print("sleeping", flush=True)
    time.sleep(60)


def test_timeout_stops_every_node(two_nodes: Cluster) -> None:
    started = time.monotonic()
    with pytest.raises(LaunchTimeoutError) as caught:
        notebook_launcher(_sleep_long, cluster=two_nodes, timeout=1.5, output=CollectingSink())
    assert time.monotonic() - started < 5.0
    assert sorted(caught.value.running) == [0, 1, 2, 3]
    assert {o.status.value for o in caught.value.outcomes} == {"timed out"}


def _fail_first_attempt() -> str:
    import os

    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "2":
        raise RuntimeError("first attempt fails")
    return os.environ["TORCHELASTIC_RUN_ID"]


def test_max_restarts_relaunches_on_every_node_under_the_same_run_id(two_nodes: Cluster) -> None:
    sink = CollectingSink()
    values = notebook_launcher(_fail_first_attempt, cluster=two_nodes, max_restarts=1, output=sink)
    # torchrun keeps its rendezvous id across restarts (TORCHELASTIC_RESTART_COUNT tells them apart)
    assert sink.attempts == 2 and len(set(values)) == 1 and values[0].startswith("nbaccel-")
    assert notebook_launcher(_fail_first_attempt, cluster=two_nodes, max_restarts=1, output=CollectingSink()) != values


class InterruptOnceAllSleep(CollectingSink):
    """Interrupts the launching thread (as the stop button does) once every rank said it sleeps:
    an event, not a guess of how long four ranks on two nodes take to start under load."""

    def __init__(self, ranks: int) -> None:
        super().__init__()
        self.expected, self.sleeping, self.sent_at = ranks, set(), None

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        super().output(rank, stream, lines)
        if any("sleeping" in line for line in lines):
            self.sleeping.add(rank)
        if len(self.sleeping) == self.expected and self.sent_at is None:
            self.sent_at = time.monotonic()
            interrupt_main_thread()


def test_an_interrupt_stops_every_node_and_the_next_launch_works(two_nodes: Cluster) -> None:
    sink = InterruptOnceAllSleep(ranks=4)
    with pytest.raises(KeyboardInterrupt) as caught:
        notebook_launcher(_sleep_long, cluster=two_nodes, output=sink, timeout=scaled(60))
    assert sink.sent_at is not None and time.monotonic() - sink.sent_at < 5.0
    assert notebook_launcher(lambda: 1, cluster=two_nodes, output=CollectingSink()) == [1] * 4
    # Where each rank was, from every node, before it was stopped (as on one node).
    stacks = {rank: [e for e in sink.events.get(rank, []) if e.get("type") == "stack"] for rank in range(4)}
    assert all(stacks.values()), stacks
    assert "time.sleep" in stacks[3][0]["summary"] and "rank 3" in str(caught.value)


def test_a_value_that_cannot_be_pickled_is_that_ranks_error(two_nodes: Cluster) -> None:
    with pytest.raises(NodeRankFailedError, match="cannot be pickled"):
        notebook_launcher(lambda: threading.Lock(), cluster=two_nodes, output=CollectingSink())


def test_each_rank_is_named_with_its_node_in_the_view(two_nodes: Cluster) -> None:
    from nbaccel.output.widgets.sink import LiveViewSink

    class Kept:
        def show(self, bundle: dict, display_id: str) -> None:
            self.last = bundle

        def update(self, bundle: dict, display_id: str) -> None:
            self.last = bundle

    sink = CollectingSink()
    assert notebook_launcher(lambda: 1, cluster=two_nodes, output=sink) == [1] * 4
    nodes = {rank: [e["node"] for e in events if e["type"] == "node"] for rank, events in sink.events.items()}
    assert nodes == {0: [0], 1: [0], 2: [1], 3: [1]}  # node by node, rank 0 beside the notebook
    published = Kept()
    live = LiveViewSink(publisher=published)
    assert notebook_launcher(lambda: 2, cluster=two_nodes, output=live) == [2] * 4
    assert live.view is not None
    titles = live.view.tabs.titles
    assert titles[0].startswith("rank 0 · node 0 ·") and titles[3].startswith("rank 3 · node 1 ·")
    saved = published.last["application/vnd.nbaccel.ranks+json"]["ranks"]
    assert saved[3]["node"].startswith("node 1")
