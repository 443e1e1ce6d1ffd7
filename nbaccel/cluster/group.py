"""The engine's ``GroupStarter`` and ``RankGroup`` for several nodes: ranks on agents, events over the network.

Per attempt the group starter assigns node ranks (the order of start_agents' hosts, or Slurm's node
order where srun started the agents; else a node on the kernel's own address first, then the
order the nodes joined) and global ranks (node by node: rank 0 is node 0's local rank 0), hosts
a fresh rendezvous store bound to the cluster's address, and sends every node the signed launch.
The group then feeds the engine's one event loop exactly as a local group does, from one source:
the launch's inbox, filled by the cluster's thread with verified messages. Lines become
``loop.lines``, a rank's events ``loop.event``, its exit ``loop.exited``; when the loop ends, each
rank's node's clock offset goes to the sink (a ``clock`` event: a profile's lanes are aligned by it); a lost node becomes an
error (``NodeLostError``) and an exit for each of its ranks still running. Signals go to the
agents, which signal only the ranks they started.

Example::

    group = ClusterGroupStarter(cluster).start_group(job, plan, attempt=0, persistent=False)
    try:
        EventLoop(group, sink, OneShot()).run()
    finally:
        group.close()
"""

from __future__ import annotations

import signal
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nbaccel.cluster.cluster import Cluster, NodeInfo
from nbaccel.cluster.inbox import Item, LaunchInbox
from nbaccel.errors import PreflightError
from nbaccel.launch.outcome import Status, with_cell_names
from nbaccel.launch.pipes import LAST_LINES
from nbaccel.launch.rendezvous import LoopbackRendezvous
from nbaccel.launch.seam import GroupStarter, LaunchPlan
from nbaccel.launch.stacks import RankStack, summarise, without_launch_frames
from nbaccel.net import protocol
from nbaccel.net.link import new_nonce
from nbaccel.wire import events, rich
from nbaccel.wire.job import Job
from nbaccel.wire.portable import Sourced

if TYPE_CHECKING:
    from nbaccel.launch.loop import EventLoop

_INBOX_ORDER = (-1, 0)
_CLOSE_GRACE = 3.0  # close(): how long nodes get to report their ranks ended before we give up
LOST_CODE = -signal.SIGKILL  # the exit status a lost node's ranks are given


_SAMPLE_FRAME_MAX = 512  # bytes: a pickled resource sample is about 150


@dataclass
class NodeSlot:
    """One node's part in a launch: its node rank, its global ranks, and whether it is done."""

    node: NodeInfo
    node_rank: int
    ranks: list[int]
    done: bool = False
    pids: list[int] = field(default_factory=list)

    def where(self) -> str:
        return f"node {self.node_rank} ({self.node.host}, {self.node.address})"


def layout(nodes: list[NodeInfo], kernel_host: str | None = None) -> list[NodeSlot]:
    """Node ranks: agents that know their place first (Slurm's SLURM_NODEID: rank 0 on the job's first
    node; start_agents' order of hosts), then the kernel's own machine (rank 0 beside the notebook),
    then the order the nodes joined."""
    ordered = sorted(nodes, key=lambda n: (n.order is None, n.order or 0, n.address != kernel_host))  # stable: join order
    slots, first = [], 0
    for node_rank, node in enumerate(ordered):
        slots.append(NodeSlot(node, node_rank, list(range(first, first + node.nproc))))
        first += node.nproc
    return slots


class ClusterGroupStarter(GroupStarter):
    """Starts every attempt (or pool) on the cluster's live nodes."""

    start_method = "fork"  # on every node, through torch elastic's start_processes

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.last_group: ClusterRankGroup | None = None

    def start_group(self, job: Job, plan: LaunchPlan, attempt: int, persistent: bool) -> ClusterRankGroup:
        self.last_group = ClusterRankGroup.start(self.cluster, job, plan, attempt)
        return self.last_group


class ClusterRankGroup:
    """The ranks of one launch on every node, as the engine's event loop drives them."""

    def __init__(self, cluster: Cluster, launch: str, slots: list[NodeSlot], inbox: LaunchInbox, store: LoopbackRendezvous) -> None:
        self.cluster = cluster
        self.launch = launch
        self.slots = slots
        self.inbox = inbox
        self.store = store
        self.slot_of = {rank: slot for slot in slots for rank in slot.ranks}
        self._codes: dict[int, int] = {}
        self._signalled: set[int] = set()
        self._memory: dict[int, tuple[int | None, str | None]] = {}  # rank -> (peak, OOM words) from its agent
        self.latest_samples: dict[int, dict[str, Any]] = {}  # rank -> its agent's latest resource sample
        self._lines: dict[int, deque[str]] = {rank: deque(maxlen=LAST_LINES) for rank in self.slot_of}
        self._loop: EventLoop | None = None
        self._closed = False
        self._deferred: list[Item] = []  # set aside while stacks() waited for its answers
        self.lost: dict[int, str] = {}  # node rank -> what was said when it was lost (a pool keeps the rest)

    @property
    def num_processes(self) -> int:
        return len(self.slot_of)

    @classmethod
    def start(cls, cluster: Cluster, job: Job, plan: LaunchPlan, attempt: int) -> ClusterRankGroup:
        """Host a fresh store, route a fresh launch id, and send every live node its part."""
        import cloudpickle

        nodes = cluster.live_nodes
        if not nodes:
            raise PreflightError(
                f"no node has joined the cluster at {cluster.address}; run `{cluster.agent_command()}` on each node, then cluster.wait(nodes=N)."
            )
        slots = layout(nodes, cluster.host)
        # By value, with the cell's file name and source: tracebacks on a node show its lines.
        job_bytes = cloudpickle.dumps(Job(Sourced.wrap(job.function), job.args, job.pass_ends, job.label))
        launch = new_nonce()[:16]
        store = LoopbackRendezvous(cluster.host, None)  # bound to the cluster's address only
        try:
            inbox = cluster.open_launch(launch)
        except BaseException:
            store.close()
            raise
        group = cls(cluster, launch, slots, inbox, store)
        try:
            store.start_store(group.num_processes)
            for slot in slots:
                spec = _spec(launch, plan, attempt, slot, len(slots), group.num_processes, cluster.host, store.port)
                if not cluster.send(slot.node, protocol.LAUNCH, launch=launch, raw=protocol.pack_mixed(spec, job_bytes)):
                    inbox.put(("lost", slot.node, "could not be sent the launch (its connection is gone)"))
        except BaseException:
            group.close()
            raise
        return group

    # -- feeding the loop ------------------------------------------------------------------------

    def attach(self, loop: EventLoop) -> None:
        self._loop = loop
        loop.add_reader(self.inbox.fd, self._on_inbox, _INBOX_ORDER)
        for rank in loop.ranks:  # the views name each rank's node (its tab title, the saved bundle)
            slot = self.slot_of[rank]
            loop.sink.event(rank, rich.node_event(slot.node_rank, slot.node.host))

    def detach(self, loop: EventLoop) -> None:
        loop.remove_reader(self.inbox.fd)
        self._loop = None
        for rank in loop.ranks:  # at the end, when the most probes are in: a profile's lanes are shifted by it
            slot = self.slot_of[rank]
            loop.sink.event(rank, rich.clock_event(slot.node_rank, slot.node.clock.offset_ns, slot.node.clock.round_trip_ns))

    def poll(self) -> float | None:
        return None  # the cluster's thread notices lost nodes and says so in the inbox

    def _on_inbox(self) -> None:
        items, self._deferred = [*self._deferred, *self.inbox.take()], []
        for kind, node, item in items:
            self._handle(kind, node, item)

    def _handle(self, kind: str, node: NodeInfo, item: Any) -> None:
        slot = next((s for s in self.slots if s.node is node), None)
        if slot is None or slot.done:
            return
        if kind == "lost":
            self._lose(slot, f"was lost: {item}")
            return
        if item.kind == protocol.LINES:
            body = item.json()
            rank = int(body["rank"])
            if rank in slot.ranks:
                self._lines[rank].extend(body["lines"])
                if self._loop is not None:
                    self._loop.lines(rank, body["stream"], body["lines"])
        elif item.kind == protocol.FRAME:
            rank, kind_number, payload = protocol.unpack_frame(item.payload)
            kind_of = events.decode_kind(kind_number)
            if rank in slot.ranks and kind_of is events.Kind.RICH:
                self._note_sample(rank, payload)
            if rank in slot.ranks and self._loop is not None:
                self._loop.event(rank, events.Event(kind_of, payload))
        elif item.kind == protocol.EXITED:
            body = item.json()
            if int(body["rank"]) in slot.ranks:
                code = 255 if body["returncode"] is None else int(body["returncode"])
                peak, words = body.get("peak_rss"), body.get("out_of_memory")  # decided by the agent, which sampled it
                self._memory[int(body["rank"])] = (int(peak) if peak is not None else None, str(words) if words else None)
                self._exit(int(body["rank"]), code, bool(body["signals_sent"]))
        elif item.kind == protocol.STARTED:
            slot.pids = [int(pid) for pid in item.json()["pids"]]
        elif item.kind == protocol.FINISHED:
            slot.done = True
        elif item.kind == protocol.FAILED:
            self._lose(slot, f"could not start its ranks ({item.json()['message']})", error_type="NodeStartError")

    def _note_sample(self, rank: int, payload: bytes) -> None:
        """Keep the latest resource sample of ``rank`` (``pool.status()`` between cells shows it).

        Only small frames are looked into: a sample is a few numbers, a display may be megabytes.
        The frame came over the signed link, verified, as every frame the loop decodes.
        """
        if len(payload) > _SAMPLE_FRAME_MAX:
            return
        event = events.loads(payload)
        if isinstance(event, dict) and event.get("type") == rich.RESOURCES:
            self.latest_samples[rank] = event

    def _exit(self, rank: int, code: int, signalled: bool) -> None:
        if rank in self._codes:
            return
        self._codes[rank] = code
        if signalled:
            self._signalled.add(rank)
        if self._loop is not None:
            self._loop.exited(rank, code)

    def _lose(self, slot: NodeSlot, reason: str, error_type: str = "NodeLostError") -> None:
        """A node is gone: its ranks still running fail naming it (unless a stop is under way) and end."""
        slot.done = True
        running = [rank for rank in slot.ranks if rank not in self._codes]
        message = f"{slot.where()} {reason}; its ranks {', '.join(map(str, running))} ended with it"
        if error_type == "NodeLostError":
            self.lost[slot.node_rank] = f"{slot.where()} {reason}; its ranks {', '.join(map(str, slot.ranks))} ended with it"
        fields = {"type_name": error_type, "message": message, "traceback": "", "timestamp": time.time()}
        for rank in running:
            outcome = self._loop.outcomes.get(rank) if self._loop is not None else None
            if self._loop is not None and outcome is not None and outcome.status is Status.RUNNING:
                self._loop.event(rank, events.Event(events.Kind.ERROR, events.dumps(fields)))
            self._exit(rank, LOST_CODE, signalled=False)

    # -- acting on the ranks ---------------------------------------------------------------------

    def signal(self, sig: int, ranks: Iterable[int]) -> None:
        chosen = [rank for rank in ranks if rank not in self._codes]
        self._signalled.update(chosen)
        for slot in self.slots:
            mine = [rank for rank in chosen if rank in slot.ranks]
            if mine and not slot.done:
                self.cluster.send(slot.node, protocol.SIGNAL, {"ranks": mine, "signal": int(sig)}, self.launch)

    def returncode(self, rank: int) -> int | None:
        if rank not in self._codes:
            self.catch_up()
        return self._codes.get(rank)

    def catch_up(self) -> None:
        """Outside a loop (a pool between cells): learn of exits and lost nodes now."""
        if self._loop is None and not self._closed:
            for kind, node, item in self.inbox.take():
                self._handle(kind, node, item)

    def was_signalled(self, rank: int) -> bool:
        return rank in self._signalled

    def memory_at_exit(self, rank: int) -> tuple[int | None, str | None]:
        """What ``rank``'s agent said of its memory when it exited: its peak resident bytes, and
        "killed by the out-of-memory killer (...)" when its agent judged the SIGKILL to be that."""
        return self._memory.get(rank, (None, None))

    def last_lines(self, rank: int) -> list[str]:
        return list(self._lines.get(rank, ()))

    def pid(self, rank: int) -> int:
        slot = self.slot_of[rank]
        local = rank - slot.ranks[0]
        return slot.pids[local] if local < len(slot.pids) else 0

    def where(self, rank: int) -> str:
        """The node a rank runs on, for error messages."""
        return self.slot_of[rank].where()

    def stacks(self, ranks: Iterable[int], timeout: float = 3.0) -> dict[int, RankStack]:
        """Ask the nodes for their running ranks' stacks; what arrives within ``timeout``.

        Other messages that arrive meanwhile are set aside for the loop (this is called from
        inside it, by a policy), and the inbox is nudged so the loop sees them next.
        """
        chosen = [rank for rank in ranks if rank not in self._codes]
        asked = {id(slot.node): slot for slot in self.slots if not slot.done and any(r in slot.ranks for r in chosen)}
        for slot in asked.values():
            self.cluster.send(slot.node, protocol.STACKS, {"ranks": [r for r in chosen if r in slot.ranks]}, self.launch)
        found: dict[int, RankStack] = {}
        deadline = time.monotonic() + timeout
        while asked and time.monotonic() < deadline:
            for item in self.inbox.wait(deadline - time.monotonic()):
                kind, node, message = item
                if kind == "message" and message.kind == protocol.STACKS and id(node) in asked:
                    del asked[id(node)]
                    for rank, text in (message.json().get("stacks") or {}).items():
                        found[int(rank)] = RankStack(int(rank), with_cell_names(without_launch_frames(text)), summarise(int(rank), text))
                else:
                    self._deferred.append(item)
                    if kind == "lost":
                        asked.pop(id(node), None)
        if self._deferred:
            self.inbox.nudge()
        return found

    def release(self) -> None:
        for slot in self.slots:
            if not slot.done:
                self.cluster.send(slot.node, protocol.RELEASE, None, self.launch)

    @property
    def shares_memory(self) -> bool:
        return False  # the ranks are on other machines: values travel pickled, signed

    def send(self, rank: int, kind: events.Kind, payload: bytes, attached: Any = None) -> None:
        if attached is not None and attached.fds:
            raise OSError("shared memory cannot reach ranks on other nodes")
        slot = self.slot_of[rank]
        if (
            slot.done
            or rank in self._codes
            or not self.cluster.send(slot.node, protocol.COMMAND, launch=self.launch, raw=protocol.pack_frame(rank, int(kind), payload))
        ):
            raise OSError(f"rank {rank} on {slot.where()} is gone")

    def close(self) -> None:
        """Stop every rank still running on every node, wait (briefly) for the nodes to say so, free all."""
        if self._closed:
            return
        self._loop = None
        try:
            for slot in self.slots:
                if not slot.done:
                    self.cluster.send(slot.node, protocol.STOP, {"reason": "stopped"}, self.launch)
            deadline = time.monotonic() + _CLOSE_GRACE
            while not all(s.done for s in self.slots) and time.monotonic() < deadline:
                for kind, node, item in self.inbox.wait(deadline - time.monotonic()):
                    self._handle(kind, node, item)
        finally:
            self._closed = True
            self.cluster.close_launch()
            self.store.close()


def _spec(launch: str, plan: LaunchPlan, attempt: int, slot: NodeSlot, nnodes: int, world: int, master_addr: str, port: int) -> dict[str, Any]:
    return {
        "launch": launch,
        "run_id": plan.run_id,  # the same across restarts, as torchrun's rendezvous id
        "attempt": attempt,
        "max_restarts": plan.max_restarts,
        "node_rank": slot.node_rank,
        "nnodes": nnodes,
        "first_rank": slot.ranks[0],
        "nproc": len(slot.ranks),
        "world_size": world,
        "master_addr": master_addr,
        "master_port": port,
        "device_type": plan.device_type,
        "mixed_precision": plan.mixed_precision,
        "gpus": None,
    }
