"""Unit tests of the launcher's parts: frames, lines, root cause, environment, rendezvous.

Imports internals (cluster.group, errors, launch.lines, launch.outcome, launch.preflight, launch.rendezvous, net, output.choose, output.sinks, wire, wire.rank_env): it tests those units directly, below the public face.
"""

from __future__ import annotations

import os
import socket

import psutil
import pytest

from nbaccel.errors import FrameError
from nbaccel.launch.lines import LineSplitter
from nbaccel.launch.outcome import RankOutcome, RemoteError, Status, root_cause
from nbaccel.launch.preflight import fork_hazards, never_fork
from nbaccel.launch.rendezvous import LoopbackRendezvous, is_loopback
from nbaccel.output.choose import make_sink
from nbaccel.output.sinks import CollectingSink, TextSink
from nbaccel.wire import events
from nbaccel.wire.rank_env import loopback_interface, rank_environment


def test_frames_survive_any_chunking() -> None:
    values = [{"a": 1}, b"x" * 100_000, None, ("t", 2.5)]
    data = b"".join(events.encode_header(events.Kind.RESULT, len(p)) + p for p in map(events.dumps, values))
    for step in (1, 7, 4096, len(data)):
        decoder = events.FrameDecoder()
        frames = []
        for i in range(0, len(data), step):
            frames += decoder.feed(data[i : i + step])
        assert [event.value() for event in frames] == values
        assert decoder.pending == 0


def test_lambdas_fall_back_to_cloudpickle() -> None:
    payload = events.dumps(lambda x: x + 1)
    assert events.loads(payload)(1) == 2


def test_the_stream_has_only_the_kinds_it_sends_and_an_unknown_kind_is_a_frame_error() -> None:
    assert [kind.name for kind in events.Kind] == [
        "RESULT",
        "ERROR",
        "RICH",
        "READY",
        "TASK",
        "STOP",
        "IMPORTED",
        "PROMPT",
        "DEBUG_OUTPUT",
        "ANSWER",
        "DEBUG_LEFT",
    ]
    header = bytes([events.VERSION, 8]) + (0).to_bytes(8, "big")  # the old LINES kind
    with pytest.raises(FrameError, match="unknown event kind 8"):
        events.FrameDecoder().feed(header)
    with pytest.raises(FrameError, match="unknown event kind 9"):
        events.decode_kind(9)


def test_a_frame_forwarded_by_a_node_agent_is_decoded_by_the_same_kind_decoder() -> None:
    """A node of another version sending an unknown kind gets FrameError, not a bare ValueError."""
    from types import SimpleNamespace

    from nbaccel.cluster.group import ClusterRankGroup, NodeSlot
    from nbaccel.net import protocol

    node = SimpleNamespace(host="h", address="10.0.0.2")
    group = ClusterRankGroup.__new__(ClusterRankGroup)
    group.slots = [NodeSlot(node=node, node_rank=1, ranks=[2, 3])]
    received: list[tuple[int, events.Event]] = []
    group._loop = SimpleNamespace(event=lambda rank, event: received.append((rank, event)))
    frame = SimpleNamespace(kind=protocol.FRAME, payload=protocol.pack_frame(2, int(events.Kind.RICH), events.dumps({"type": "x"})))
    group._handle("message", node, frame)
    assert [(rank, event.kind) for rank, event in received] == [(2, events.Kind.RICH)]
    with pytest.raises(FrameError, match="unknown event kind 42"):
        group._handle("message", node, SimpleNamespace(kind=protocol.FRAME, payload=protocol.pack_frame(3, 42, b"")))


def test_line_splitter_keeps_partial_lines_and_resolves_carriage_returns() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"hel") == []
    assert splitter.partial == "hel"
    assert splitter.feed(b"lo\nwor") == ["hello"]
    assert splitter.feed(b"ld\r\n") == ["world"]
    assert splitter.feed(b" 1%\r 50%\r100%\n") == ["100%"]
    assert splitter.feed("é".encode()[:1]) == []  # a character split across reads
    assert splitter.feed("é".encode()[1:] + b"\n") == ["é"]
    assert splitter.feed(b"tail") == []
    assert splitter.flush() == ["tail"]


def _failed(rank: int, message: str, at: float, type_name: str = "RuntimeError") -> RankOutcome:
    return RankOutcome(rank, Status.FAILED, 1, error=RemoteError(type_name, message, "", at))


def test_root_cause_is_the_real_error_not_a_peer_connection_error() -> None:
    peer = _failed(0, "[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:1234", at=1.0)
    real = _failed(1, "boom", at=2.0, type_name="ValueError")
    assert root_cause([peer, real]) is real
    assert root_cause([_failed(0, "b", 5.0), _failed(1, "a", 3.0)]).rank == 1  # earliest real error
    crashed = RankOutcome(2, Status.SIGNALED, signal=11)
    assert root_cause([peer, crashed]) is crashed
    assert root_cause([RankOutcome(0, Status.SUCCEEDED), RankOutcome(1, Status.STOPPED)]) is None


def test_outcome_descriptions_name_signals_and_codes() -> None:
    assert RankOutcome(1, Status.SIGNALED, signal=9).describe() == "rank 1: killed by SIGKILL"
    assert RankOutcome(0, Status.EXITED, exitcode=3).describe() == "rank 0: exited with code 3 without returning"


def test_rank_environment_is_complete_and_respects_user_interface(monkeypatch: pytest.MonkeyPatch) -> None:
    env = rank_environment(rank=2, world_size=4, master_port=1234, device_type="cpu", mixed_precision="bf16", restart_count=1)
    assert env["RANK"] == env["LOCAL_RANK"] == "2"
    assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "4"
    assert (env["NODE_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == ("0", "127.0.0.1", "1234")
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16" and env["FORK_LAUNCHED"] == "1" == env["NBACCEL_FORK_LAUNCHED"]
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True" and env["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == loopback_interface()
    env = rank_environment(rank=0, world_size=1, master_port=1, device_type="cpu", inherited={"GLOO_SOCKET_IFNAME": "eth7"})
    assert env["GLOO_SOCKET_IFNAME"] == "eth7"
    across = rank_environment(rank=3, world_size=4, master_port=1, device_type="cpu", node_rank=1, num_nodes=2, inherited={}, socket_interface="")
    assert "GLOO_SOCKET_IFNAME" not in across and (across["NBACCEL_NODE_RANK"], across["NBACCEL_NUM_NODES"]) == ("1", "2")
    assert rank_environment(rank=0, world_size=1, master_port=1, device_type="cpu", inherited={}, socket_interface="eth1")["NCCL_SOCKET_IFNAME"] == "eth1"


def test_loopback_addresses() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.3.4.5", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "10.0.0.1", "example.org", "::"]))


def test_rendezvous_listens_on_loopback_only_and_frees_its_port() -> None:
    rdzv = LoopbackRendezvous()
    rdzv.start_store(world_size=1)
    listening = [c for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN and c.laddr.port == rdzv.port]
    assert listening and all(c.laddr.ip == "127.0.0.1" for c in listening)
    rdzv.close()
    with socket.create_server(("127.0.0.1", rdzv.port)):  # the port is free again at once
        pass


def test_rendezvous_on_a_taken_port_says_so() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(Exception, match=f"port {port} on 127.0.0.1 is already in use"):
            LoopbackRendezvous(port=port)


def test_sink_selection() -> None:
    assert isinstance(make_sink("text"), TextSink)
    sink = CollectingSink()
    assert make_sink(sink) is sink
    with pytest.raises(TypeError):
        make_sink(3)


def test_text_sink_labels_lines(capsys: pytest.CaptureFixture[str]) -> None:
    sink = TextSink()
    sink.output(0, "stdout", ["a", "b"])
    sink.output(3, "stderr", ["oops"])
    out, err = capsys.readouterr()
    assert out == "[rank 0] a\n[rank 0] b\n" and err == "[rank 3] oops\n"


def test_no_fork_hazard_in_a_plain_process() -> None:
    assert never_fork(fork_hazards()) == []  # an earlier test's torch op may have started the OpenMP pool
    assert os.environ.get("RANK") is None  # the launcher never writes the kernel's environment
