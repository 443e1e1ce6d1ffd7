"""``nbaccel.Cluster``: the kernel's end of several machines, where node agents join.

The cluster listens on the one address it is given (never on every interface), keeps a fresh
32-byte secret in a file only its owner can read, and runs one background thread that accepts
agents, authenticates them, exchanges heartbeats and routes each launch's messages to the cell
that launched. A node silent for ``NODE_LOST_AFTER`` seconds, or whose connection closes, is lost.
Each node's clock offset from the kernel's is measured over the same link (``nbaccel.net.clock``):
a burst of probes when it joins, then one in every heartbeat; ``NodeInfo.clock`` holds the best.

Example::

    cluster = nbaccel.Cluster("10.0.0.1:0")
    print(cluster.agent_command())     # run this on every node
    cluster.wait(nodes=2)
    nbaccel.notebook_launcher(train, cluster=cluster)
    cluster.close()
"""

from __future__ import annotations

import atexit
import contextlib
import html
import ipaddress
import logging
import os
import selectors
import socket
import threading
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nbaccel.cluster.inbox import LaunchInbox
from nbaccel.cluster.nodes import NodeInfo, version_refusal
from nbaccel.cluster.starters import AgentStart, AgentStartError, check_starts, start_with
from nbaccel.net import clock, protocol
from nbaccel.net.link import Link, new_nonce, split_address
from nbaccel.net.signing import Message, new_secret, private_token_dir, write_token_file

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self needs Python 3.11; annotations only, never imported

__all__ = ["AgentStartError", "Cluster", "NodeInfo"]

log = logging.getLogger("nbaccel.cluster")


_OPEN_CLUSTERS: weakref.WeakSet[Cluster] = weakref.WeakSet()


@atexit.register
def _close_every_cluster() -> None:
    """At kernel shutdown: tell the agents (they stop their ranks) and remove the token files."""
    for cluster in list(_OPEN_CLUSTERS):
        cluster.close()


def node_range(nodes: int | str) -> tuple[int, int]:
    """``nodes`` as (least, most): an int N is (N, N); "MIN:MAX" as torch elastic's ``--nnodes``.

    Example:
        >>> node_range(2), node_range("2:4"), node_range("3")
        ((2, 2), (2, 4), (3, 3))
    """
    text = str(nodes)
    least, colon, most = text.partition(":")
    try:
        low, high = int(least), int(most if colon else least)
    except ValueError:
        low, high = 0, -1
    if isinstance(nodes, bool) or low < 1 or high < low:
        raise ValueError(f"nodes={nodes!r}: give a node count (2) or a range MIN:MAX with 1 <= MIN <= MAX ('2:4').")
    return low, high


def _listen(host: str, port: int) -> socket.socket:
    try:
        unspecified = ipaddress.ip_address(host).is_unspecified
    except ValueError:
        unspecified = False
    if unspecified or host == "":
        raise ValueError(
            f"Cluster({host!r}:{port}) would listen on every interface. Give the address of the one "
            "interface the nodes reach this machine on (a private network), e.g. Cluster('10.0.0.1:0')."
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(
            exc.errno, f"Cluster cannot listen on {host}:{port}: {exc.strerror}. Use an address of this machine and a free port (0 picks one)."
        ) from None
    sock.listen(64)
    sock.set_inheritable(False)
    return sock


class Cluster:
    """Node agents joined to this kernel; pass it to ``notebook_launcher(..., cluster=)``."""

    def __init__(self, address: str = "127.0.0.1:0", token_dir: str | None = None) -> None:
        host, port = split_address(address if ":" in address else f"{address}:0")
        self.host = host
        self._listener = _listen(host, port)
        self.port: int = self._listener.getsockname()[1]
        self._secret = new_secret()
        # Default: a private folder in the home directory, which a cluster's shared home shows the nodes.
        self.token_file = write_token_file(self._secret, private_token_dir(token_dir))
        self.starts: list[AgentStart] = []  # agents on their way (ssh sessions, srun, a Slurm job)
        self.nodes: list[NodeInfo] = []
        self.refused: list[str] = []  # why agents were turned away (wrong token, bad stream)
        self._pending: dict[int, tuple[Link, str]] = {}  # fd -> (link, kernel nonce) before join
        self._changed = threading.Condition()
        self._inbox: LaunchInbox | None = None
        self._launch: str | None = None
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        self._selector.register(self._listener, selectors.EVENT_READ, "accept")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="nbaccel-cluster", daemon=True)
        self._thread.start()
        _OPEN_CLUSTERS.add(self)

    # -- the public face -----------------------------------------------------------------------

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def agent_command(self, nproc_per_node: int | None = None) -> str:
        """The command to run on every node (with a copy of ``token_file`` at the same path)."""
        command = f"nbaccel-agent {self.address} --token-file {self.token_file}"
        return command if nproc_per_node is None else f"{command} --nproc-per-node {nproc_per_node}"

    def start_agents(
        self,
        via: str | list[str] = "ssh",
        hosts: list[str] | str | None = None,
        *,
        agent: str | list[str] | None = None,
        nproc_per_node: int | None = None,
        ssh_options: Sequence[str] | str = (),
        ssh_config: str | None = None,
        nodes: int | None = None,
        gpus_per_node: int | None = None,
        time: str | None = None,
        partition: str | None = None,
        sbatch_options: Sequence[str] | str = (),
        cpus_per_node: float | None = None,
        strategy: str | None = None,
        ray_address: str | None = None,
    ) -> list[AgentStart]:
        """Start the agents from here: ``via="ssh"`` (``hosts``), ``"slurm"``, ``"ray"`` or a command template.

        ``via="ray"`` (the kernel a Ray driver: ``ray.init(address="auto")``, or ``ray_address=``):
        a placement group of ``nodes`` bundles of ``gpus_per_node`` GPUs and ``cpus_per_node`` CPUs
        (``strategy="STRICT_SPREAD"``: one per Ray node; ``"PACK"`` too), one agent actor in each.

        ``agent``: the agent's path on the nodes (default: the kernel's environment's
        ``nbaccel-agent``, right for a shared filesystem). Then ``wait(nodes=N)``: it fails at
        once, with the starting command's exit code and output, when a starting command ends before its agent
        joined. ``close()`` ends what was started (a submitted Slurm job is cancelled, Ray's actors
        and placement group removed). See docs/multinode.md for each way.
        """
        slurm: dict[str, Any] = {"nodes": nodes, "gpus_per_node": gpus_per_node, "time_limit": time, "partition": partition, "sbatch_options": sbatch_options}
        slurm |= {"cpus_per_node": cpus_per_node, "strategy": strategy, "ray_address": ray_address}  # via="ray"
        slurm = {name: value for name, value in slurm.items() if value is not None and value not in ((), [])}
        if self._closed:
            raise RuntimeError(f"the cluster at {self.address} is closed; make a new one")
        started = start_with(
            via,
            self.address,
            self.token_file,
            hosts=hosts,
            agent=agent,
            nproc_per_node=nproc_per_node,
            ssh_options=ssh_options,
            ssh_config=ssh_config,
            first_order=sum(s.expected for s in self.starts),
            **slurm,
        )
        self.starts.extend(started)
        return started

    @property
    def live_nodes(self) -> list[NodeInfo]:
        with self._changed:
            return [n for n in self.nodes if n.alive]

    def wait(self, nodes: int | str = 2, timeout: float = 120.0, settle: float = 0.0) -> list[NodeInfo]:
        """Block until ``nodes`` agents are joined, alive and their clocks measured (a few ms after
        the join: ``NodeInfo.clock``); TimeoutError naming what is missing.

        ``nodes="MIN:MAX"`` (torch elastic's range): returns once MIN joined within ``timeout``,
        after waiting up to ``settle`` seconds more for up to MAX (at once when MAX joined).
        Launches and pools run on the nodes joined then; ``pool.restart()`` takes those joined since.
        """
        least, most = node_range(nodes)
        deadline = time.monotonic() + timeout
        said: dict[int, str] = {}
        with self._changed:
            while self._ready_count() < least:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise TimeoutError(self._missing(nodes if isinstance(nodes, int) else least, timeout, said))
                check_starts(self.starts, [(n.started_by, n.joined_at) for n in self.nodes], said)
                self._changed.wait(min(left, 0.1 if self.starts else 0.5))
            settled = time.monotonic() + settle
            while self._ready_count() < most and not self._closed and (left := settled - time.monotonic()) > 0:
                self._changed.wait(min(left, 0.5))
            return [n for n in self.nodes if n.alive]

    def _ready_count(self) -> int:
        return len([n for n in self.nodes if n.alive and n.clock.count >= clock.JOIN_SAMPLES])

    def _missing(self, nodes: int, timeout: float, said: dict[int, str]) -> str:
        joined = len([n for n in self.nodes if n.alive])
        refused = f"; refused: {'; '.join(self.refused[-3:])}" if self.refused else ""
        waiting = "".join(f"; {p}" for p in said.values())
        unmeasured = [n.name for n in self.nodes if n.alive and n.clock.count < clock.JOIN_SAMPLES]
        if unmeasured:  # joined, but silent to the clock probes: an agent that does not answer them
            waiting += f"; node(s) {', '.join(unmeasured)} joined but did not answer the clock probes"
        return (
            f"{joined} of {nodes} nodes joined the cluster at {self.address} within {timeout:g} s{refused}{waiting}. Run `{self.agent_command()}` on each node."
        )

    def close(self) -> None:
        """Tell every agent to stop its ranks and exit; release the port and the token file."""
        if self._closed:
            return
        for node in self.live_nodes:
            self.send(node, protocol.CLOSE)
        self._closed = True
        _OPEN_CLUSTERS.discard(self)
        os.write(self._wake_w, b"x")
        self._thread.join(5.0)
        starts, self.starts = self.starts, []
        for start in starts:  # the agents were told to exit; a starting command still running is ended
            start.stop(grace=5.0)
        try:
            os.unlink(self.token_file)
        except FileNotFoundError:
            pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        lines = [f"nbaccel.Cluster at {self.address}: {len(self.live_nodes)} node(s) joined", "Run on each node:", f"  {self.agent_command()}"]
        lines += [
            f"  node {n.name}: {n.host} {n.address}, {n.nproc} rank(s), {n.gpus} GPU(s), {n.started_by}, {'alive' if n.alive else 'lost: ' + n.lost_reason}, clock {n.clock.describe()}"
            for n in self.nodes
        ]
        if self.refused:
            lines.append(f"Refused {len(self.refused)} connection(s); last: {self.refused[-1]}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(n.name)}</td><td>{html.escape(n.host)}</td><td>{html.escape(n.address)}</td><td>{n.nproc}</td><td>{n.gpus}</td><td>{html.escape(n.started_by)}</td><td>{'alive' if n.alive else 'lost'}</td><td>{html.escape(n.clock.describe())}</td></tr>"
            for n in self.nodes
        )
        return (
            f"<div><b>nbaccel.Cluster</b> at <code>{html.escape(self.address)}</code>, {len(self.live_nodes)} node(s) joined."
            f"<br>Run on each node: <code>{html.escape(self.agent_command())}</code>"
            f"<table><tr><th>node</th><th>host</th><th>address</th><th>ranks</th><th>GPUs</th><th>started</th><th>state</th><th title='its clock minus the kernel&#39;s, ± half the round trip'>clock</th></tr>{rows}</table></div>"
        )

    # -- used by the cluster's rank groups -----------------------------------------------------------

    def send(self, node: NodeInfo, kind: str, body: Any = None, launch: str | None = None, raw: bytes | None = None) -> bool:
        """Send to one node; False if it is gone (the thread will declare it lost)."""
        if node.link is None:
            return False
        try:
            node.link.send(kind, body, launch, raw)
            return True
        except OSError:
            return False

    def open_launch(self, launch: str) -> LaunchInbox:
        """Route ``launch``'s messages (and news of lost nodes) to the returned inbox."""
        inbox = LaunchInbox()
        with self._changed:
            if self._launch is not None:
                inbox.close()
                raise RuntimeError(f"the cluster at {self.address} is busy with another launch or pool; one at a time (stop the pool first)")
            self._launch, self._inbox = launch, inbox
        return inbox

    def close_launch(self) -> None:
        with self._changed:
            inbox, self._launch, self._inbox = self._inbox, None, None
        if inbox is not None:
            inbox.close()

    # -- the thread ----------------------------------------------------------------------------

    def _serve(self) -> None:
        next_beat = 0.0
        try:
            while not self._closed:
                for key, _ in self._selector.select(0.1):
                    self._on_ready(key)
                now = time.monotonic()
                if now >= next_beat:
                    self._beat(now)
                    next_beat = now + protocol.HEARTBEAT_EVERY
        finally:
            self._shut_down()

    def _on_ready(self, key: selectors.SelectorKey) -> None:
        if key.data == "accept":
            self._accept()
        elif key.data == "wake":
            os.read(self._wake_r, 64)
        elif isinstance(key.data, NodeInfo):
            self._on_node(key.data)
        else:
            self._on_pending(key.fd)

    def _accept(self) -> None:
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.set_inheritable(False)
        nonce = new_nonce()
        link = Link(sock, self._secret, sender="kernel", session=nonce)
        link.verifier.session = None  # the join names the full session; checked in _on_pending
        try:
            link.send(protocol.HELLO)
        except OSError:
            link.close()
            return
        self._pending[sock.fileno()] = (link, nonce)
        self._selector.register(sock, selectors.EVENT_READ, None)

    def _on_pending(self, fd: int) -> None:
        link, nonce = self._pending[fd]
        try:
            messages = link.receive()
        except EOFError as exc:
            self._refuse(fd, f"{link.peer}: {exc}")
            return
        if not messages:
            return
        join = messages[0]
        session = str(join.header.get("session", ""))
        if join.kind != protocol.JOIN or not session.startswith(nonce + "."):
            self._refuse(fd, f"{link.peer}: first message was not a join for this session")
            return
        link.start_session(session)
        refusal = version_refusal(join.json() or {})
        if refusal is not None:
            with contextlib.suppress(OSError):  # it hears why, if it still listens
                link.send(protocol.REFUSED, {"reason": refusal})
            self._refuse(fd, f"{link.peer}: {refusal}")
            return
        self._admit(fd, link, join)

    def _refuse(self, fd: int, reason: str) -> None:
        link, _ = self._pending.pop(fd)
        self._selector.unregister(fd)
        link.close()
        self.refused.append(reason)
        log.warning("nbaccel.Cluster refused an agent: %s", reason)

    def _admit(self, fd: int, link: Link, join: Message) -> None:
        del self._pending[fd]
        info = join.json() or {}
        with self._changed:
            node = NodeInfo(
                name=str(len(self.nodes)),
                host=str(info.get("host", "?")),
                address=str(info.get("address", link.peer)),
                nproc=int(info.get("nproc", 1)),
                gpus=int(info.get("gpus", 0)),
                device_type=str(info.get("device_type") or "cuda"),
                pid=int(info.get("pid", 0)),
                started_by=str(info.get("started_by") or "by hand"),
                order=int(info["order"]) if isinstance(info.get("order"), int) else None,
                link=link,
            )
            # Welcomed before anyone can see it: a launch sent right after wait() returns comes second.
            self.send(node, protocol.WELCOME, {"node": node.name})
            self.nodes.append(node)
            self._changed.notify_all()
        self._selector.modify(fd, selectors.EVENT_READ, node)
        self.send(node, protocol.CLOCK, {"t0": clock.now_ns()})  # the join's burst: each answer asks the next

    def _on_node(self, node: NodeInfo) -> None:
        assert node.link is not None
        try:
            messages = node.link.receive()
        except EOFError:
            self._lose(node, "its connection closed (the agent or its machine stopped)")
            return
        received_ns = clock.now_ns()  # as soon as read: a clock answer's t3
        node.last_seen = time.monotonic()
        for message in messages:
            if message.kind == protocol.CLOCK:
                self._on_clock(node, message, received_ns)
            else:
                self._route(node, message)

    def _on_clock(self, node: NodeInfo, message: Message, received_ns: int) -> None:
        try:
            node.clock.add(clock.sample_of(message.json(), received_ns))
        except (KeyError, TypeError, ValueError):  # signed by the agent, so a bug, not an attack: say it
            log.warning("nbaccel.Cluster: node %s sent a malformed clock answer: %r", node.name, message.payload[:200])
            return
        if node.clock.count < clock.JOIN_SAMPLES:
            self.send(node, protocol.CLOCK, {"t0": clock.now_ns()})
        elif node.clock.count == clock.JOIN_SAMPLES:
            with self._changed:
                self._changed.notify_all()  # wait() counts the node from now on

    def _route(self, node: NodeInfo, message: Message) -> None:
        if message.kind == protocol.HEARTBEAT:
            return
        with self._changed:
            inbox = self._inbox if message.launch is not None and message.launch == self._launch else None
        if inbox is not None:
            inbox.put(("message", node, message))
        else:
            log.debug("nbaccel.Cluster: dropped %s from node %s for launch %r (not running)", message.kind, node.name, message.launch)

    def _beat(self, now: float) -> None:
        for node in self.live_nodes:
            if now - node.last_seen > protocol.NODE_LOST_AFTER:
                self._lose(node, f"no heartbeat for {protocol.NODE_LOST_AFTER:g} s (its network or machine is down)")
            else:
                self.send(node, protocol.HEARTBEAT, {"t0": clock.now_ns()})  # a clock probe in each heartbeat

    def _lose(self, node: NodeInfo, reason: str) -> None:
        with self._changed:
            if not node.alive:
                return
            node.alive, node.lost_reason = False, reason
            inbox = self._inbox
            self._changed.notify_all()
        if node.link is not None:
            if node.link.fileno() >= 0:
                self._selector.unregister(node.link.fileno())
            node.link.close()
        if inbox is not None:
            inbox.put(("lost", node, reason))

    def _shut_down(self) -> None:
        for node in list(self.live_nodes):
            self._lose(node, "the cluster closed")
        for link, _ in self._pending.values():
            link.close()
        self._pending.clear()
        self._selector.close()
        self._listener.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
