"""Nothing reaches pickle unless it is signed, fresh and for the running launch.

Each payload here would create a file when unpickled: the file must never appear.

Imports internals (net.link, net.signing): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading

import psutil
import pytest

from nbaccel import Cluster, notebook_launcher
from nbaccel.net.link import cluster_id
from nbaccel.net.signing import new_secret, read_token, seal
from nbaccel.testing import CollectingSink
from tests.agent.harness import CreatesFile, agent_argv, descendants, poison, stop_agents, wait_until
from tests.agent.proxy import Proxy
from tests.handshake import mark, wait_for

pytestmark = pytest.mark.timeout(60)


def test_unsigned_and_mis_signed_bytes_sent_to_the_cluster_never_run(two_nodes: Cluster, tmp_path) -> None:
    target = tmp_path / "executed"
    refused = len(two_nodes.refused)
    secret = read_token(two_nodes.token_file)
    header = {"cluster": cluster_id(secret), "session": "x", "launch": None, "kind": "join", "sender": "evil", "seq": 1}
    attempts = [
        poison(str(target)),  # a bare pickle
        seal(new_secret(), header, poison(str(target))),  # signed with the wrong key
        seal(secret, header, poison(str(target)))[:-1] + b"\0",  # a broken signature
    ]
    for data in attempts:
        with socket.create_connection(("127.0.0.1", two_nodes.port), timeout=5) as sock:
            sock.sendall(data)
            assert wait_until(lambda before=refused: len(two_nodes.refused) > before, 3.0)
            refused = len(two_nodes.refused)
    assert not target.exists()
    assert len(two_nodes.live_nodes) == 2
    assert notebook_launcher(lambda: 1, cluster=two_nodes, output=CollectingSink()) == [1] * 4


def _poison_the_store(path: str) -> int:
    import pickle

    import torch.distributed as dist

    dist.init_process_group("gloo")
    store = dist.distributed_c10d._get_default_store()
    payload = pickle.dumps(CreatesFile(path))
    dist.barrier()
    if dist.get_rank() == 0:
        for key in ("torch.rendezvous.nbaccel", "nbaccel", "0", "1"):
            store.set(key, payload)
    dist.barrier()
    return dist.get_rank()


def test_poison_written_into_the_rendezvous_store_is_never_unpickled(two_nodes: Cluster, tmp_path) -> None:
    target = tmp_path / "executed"
    assert notebook_launcher(_poison_the_store, (str(target),), cluster=two_nodes, output=CollectingSink()) == [0, 1, 2, 3]
    assert not target.exists()
    # The next launch goes over the same ordered links: by its end each agent and the kernel
    # have finished with the poisoned launch, whatever they still did after its results came.
    assert notebook_launcher(lambda: 2, cluster=two_nodes, output=CollectingSink()) == [2] * 4
    assert not target.exists()


def _returns_poison(path: str, ran: str) -> CreatesFile:
    with open(ran, "a") as handle:
        handle.write("ran\n")
    return CreatesFile(path)


def test_replayed_messages_are_refused_both_ways(tmp_path) -> None:
    in_kernel, ran = tmp_path / "unpickled-in-kernel", tmp_path / "ran"
    with Cluster("127.0.0.1:0") as cluster, Proxy(cluster.address) as proxy:
        agent = subprocess.Popen(agent_argv(proxy.address, cluster.token_file, 1), stderr=subprocess.PIPE, text=True)
        said: list[str] = []  # the agent's log, read as it comes
        reader = threading.Thread(target=lambda: said.extend(agent.stderr or []), name="agent-stderr")
        reader.start()
        try:
            cluster.wait(nodes=1, timeout=60)
            values = notebook_launcher(_returns_poison, (str(in_kernel), str(ran)), cluster=cluster, output=CollectingSink())
            assert values == [str(in_kernel)] and in_kernel.exists()  # the genuine delivery, once
            in_kernel.unlink()
            results = [f for f in proxy.frames["to_kernel"]["frame"]]
            launch = proxy.frames["to_agent"]["launch"][0]
            for frame in results:
                proxy.inject_to_kernel(frame)  # replayed results: the kernel must not unpickle them
            proxy.inject_to_agent(launch)  # a replayed launch: the agent must not start ranks
            header, body = _split(launch)
            proxy.inject_to_agent(seal(new_secret(), {**header, "seq": 10**6}, body))  # forged: wrong key
            proxy.inject_to_agent(seal(read_token(cluster.token_file), {**header, "seq": 10**6}, body)[:-1] + b"\0")  # bad MAC
            link = cluster.nodes[0].link
            assert link is not None and wait_until(lambda: link.refused >= len(results), 3.0)  # refused as replays
            # The agent logs each frame it drops: the last two injected were the forged ones.
            assert wait_until(lambda: "".join(said).count("bad signature") == 2, 10.0), said
            assert not in_kernel.exists()
            assert ran.read_text() == "ran\n" and not descendants(agent.pid)
            assert notebook_launcher(lambda: 3, cluster=cluster, output=CollectingSink()) == [3]
            assert len(cluster.live_nodes) == 1
        finally:
            cluster.close()
            stop_agents([agent])
            reader.join(10)
            stderr = "".join(said)
            if agent.stderr:
                agent.stderr.close()
    assert "replayed" in stderr and stderr.count("bad signature") == 2  # the agent logged what it dropped


def _split(frame: bytes) -> tuple[dict, bytes]:
    import json
    import struct

    _, header_len, payload_len = struct.unpack_from("!4sIQ", frame)
    return json.loads(frame[16 : 16 + header_len]), frame[16 + header_len : 16 + header_len + payload_len]


def test_during_a_launch_every_listening_socket_is_on_the_clusters_address(two_nodes: Cluster, tmp_path) -> None:
    agents = [a.pid for a in two_nodes.agents]  # type: ignore[attr-defined]
    seen: list[tuple[str, int]] = []

    def listening_now() -> list[tuple[str, int]]:
        pids = {os.getpid(), *agents, *(p for a in agents for p in descendants(a))}
        found = []
        for pid in pids:
            try:
                found += [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
            except psutil.NoSuchProcess:
                pass
        return found

    def look(folder: str) -> int:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        dist.barrier()
        mark(os.path.join(folder, f"open{dist.get_rank()}"))  # the store and gloo's sockets are open
        wait_for(os.path.join(folder, "looked"))  # the test looks now
        return 0

    def watch() -> None:
        try:
            wait_for(*(tmp_path / f"open{rank}" for rank in range(4)))
            seen.extend(listening_now())
        finally:
            mark(tmp_path / "looked")

    thread = threading.Thread(target=watch)
    thread.start()
    notebook_launcher(look, (str(tmp_path),), cluster=two_nodes, output=CollectingSink())
    thread.join()
    assert len(seen) >= 2  # the cluster and the launch's store at least
    assert {ip for ip, _ in seen} == {"127.0.0.1"}, seen
    print(sorted(seen))
