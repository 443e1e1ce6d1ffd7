"""Accelerate's multi-node notebooks: each node's kernel runs its own ranks, and the nodes meet first.

``notebook_launcher(fn, num_processes=2, num_nodes=2, node_rank=R, master_addr=HOST, use_port=P)``
in one notebook per machine (Accelerate's workflow). Before any rank starts, the kernels meet at
``HOST:P`` through torch's rendezvous and tell each other how many ranks each runs, so every node
knows its ranks' place in the whole world:

- ``rdzv_backend="static"``: node ``node_rank`` 0's kernel serves a fresh TCPStore bound to
  ``HOST:P`` only (torch's own TCPStore would listen on every interface); the node ranks are the
  ``node_rank``s given. The store lives as long as node 0's launch: the next launch gets a fresh
  one (no stale keys, Accelerate's defect), and the port is bound with SO_REUSEADDR.
- ``rdzv_backend="c10d"``: torch elastic's c10d rendezvous handler (the machine whose name or
  address is the endpoint's hosts the store, as torchrun does); node ranks follow the order of
  arrival, and ``node_rank`` is only this kernel's guess.

Every rank then connects to that store as a client (``TORCHELASTIC_USE_AGENT_STORE``), as torchrun's
workers do with their agent's store. The exchange's keys live under ``nbaccel/<rdzv_id>/``.

Example::

    meeting = meet_nodes(options, local_ranks=2, device_type="cpu", socket_interface="lo")
    try:
        run_launch(LocalGroupStarter(ForkStarter(), world=meeting.world), job, plan, sink)
    finally:
        meeting.close()
"""

from __future__ import annotations

import datetime
import json
import socket
import time
from dataclasses import dataclass
from typing import Any

from nbaccel.errors import PreflightError
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.rendezvous import LoopbackRendezvous

DEFAULT_JOIN_TIMEOUT = 600.0  # torch elastic's c10d default: ten minutes for every node's notebook to call
# The store's own blocking wait holds the main thread in C++ (Ctrl-C would wait for the join
# timeout) and logs a warning at each short timeout: look for the keys this often instead.
_LOOK_EVERY = 0.05


class StoreAddress:
    """The store of a ``num_nodes`` launch as a rank group sees it: an address the launch owns."""

    def __init__(self, address: str, port: int, child_closes: tuple[int, ...] = ()) -> None:
        self.address = address
        self.port = port
        self._child_closes = child_closes

    @property
    def listen_fd(self) -> int | None:
        return None  # the store is up before any rank starts

    @property
    def store_started(self) -> bool:
        return True

    @property
    def child_closes(self) -> tuple[int, ...]:
        return self._child_closes

    def start_store(self, world_size: int, timeout: float = 300.0) -> None:
        pass

    def close(self) -> None:
        pass  # the launch closes it (``NodeMeeting.close``), after its last rank ended


@dataclass(frozen=True)
class NodeWorld:
    """This node's place in a ``num_nodes`` launch, agreed by every node before any rank starts."""

    node_rank: int
    num_nodes: int
    first_rank: int  # the global rank of this node's local rank 0
    world_size: int  # ranks of every node together
    nprocs: tuple[int, ...]  # ranks of each node, by node rank
    rendezvous: StoreAddress
    run_id: str
    socket_interface: str | None  # gloo's and NCCL's interface; None: loopback

    def global_rank(self, local_rank: int) -> int:
        return self.first_rank + local_rank


class NodeMeeting:
    """What a node holds while its ranks run: the store it serves (static, node 0) or torch's handler."""

    def __init__(self, world: NodeWorld, keep: list[Any]) -> None:
        self.world = world
        self._keep = keep  # the store served here, the kernel's client, torch's handler

    def close(self) -> None:
        """Free the store (node 0: its port) and the kernel's connection to it; shut torch's c10d
        handler down (its heartbeat thread stops; the store dies with its host's handler, so the
        next launch meets in a fresh one)."""
        for thing in self._keep:
            if isinstance(thing, LoopbackRendezvous):
                thing.close()
            elif callable(getattr(thing, "shutdown", None)):
                try:
                    thing.shutdown()
                except Exception:  # noqa: BLE001 - the host's store may be gone already (its launch ended first)
                    pass
        self._keep.clear()


def meet_nodes(options: LaunchOptions, local_ranks: int, device_type: str, socket_interface: str | None, local_address: str | None = None) -> NodeMeeting:
    """Meet the other nodes' kernels; this node's place in the world. Blocks until every node came
    (``rdzv_conf['join_timeout']``, default 600 s; a PreflightError names the nodes missing)."""
    conf = dict(options.rdzv_conf)
    if "rank" in conf and int(conf["rank"]) != options.node_rank:
        raise ValueError(f"rdzv_conf['rank']={conf['rank']!r} but node_rank={options.node_rank!r}: pass one of them (node_rank).")
    join_timeout = float(conf.get("join_timeout", conf.get("timeout", DEFAULT_JOIN_TIMEOUT)))
    host, port = options.rendezvous_endpoint
    if options.rdzv_backend == "c10d":
        store, node_rank, keep, (host, port) = _c10d(options, host, port, join_timeout, local_address)
        served: tuple[int, ...] = ()
    else:
        store, keep, served = _static(options, host, port, join_timeout)
        node_rank = options.node_rank
    deadline = time.monotonic() + join_timeout
    prefix = f"nbaccel/{options.rdzv_id}/"
    if int(store.add(f"{prefix}claims/{node_rank}", 1)) > 1:
        raise PreflightError(
            f"node_rank={node_rank} was claimed by another node too, at {host}:{port}: give each node's notebook its own node_rank, 0 to {options.num_nodes - 1}."
        )
    store.set(f"{prefix}node/{node_rank}", json.dumps({"nproc": local_ranks, "device": device_type}))
    nodes = [json.loads(_wait_get(store, f"{prefix}node/{rank}", deadline, options, host, port)) for rank in range(options.num_nodes)]
    devices = [str(node["device"]) for node in nodes]
    if len(set(devices)) > 1:
        said = ", ".join(f"node {rank}: {device}" for rank, device in enumerate(devices))
        raise PreflightError(
            f"the nodes disagree on the device: {said}; one process group needs one backend: pass cpu=True on every node, or give every node GPUs."
        )
    nprocs = tuple(int(node["nproc"]) for node in nodes)
    world = NodeWorld(
        node_rank=node_rank,
        num_nodes=options.num_nodes,
        first_rank=sum(nprocs[:node_rank]),
        world_size=sum(nprocs),
        nprocs=nprocs,
        rendezvous=StoreAddress(host, port, served),
        run_id=options.rdzv_id,
        socket_interface=socket_interface,
    )
    return NodeMeeting(world, keep)


def _static(options: LaunchOptions, host: str, port: int, join_timeout: float) -> tuple[Any, list[Any], tuple[int, ...]]:
    """Node 0 serves the store on ``host:port`` only; the others connect to it."""
    if options.node_rank == 0:
        served = LoopbackRendezvous(host, port)  # bound to host: a PreflightError names a taken port
        served.start_store(options.num_nodes, timeout=join_timeout)
        return served.store, [served], served.child_closes
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # exported at run time only

    _wait_listening(host, port, time.monotonic() + join_timeout, options)
    try:
        client = TCPStore(host, port, None, False, datetime.timedelta(seconds=join_timeout), wait_for_workers=False)
    except RuntimeError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__  # torch appends its C++ stack
        raise PreflightError(
            f"node {options.node_rank} could not reach node 0's store at {host}:{port} ({first_line}); "
            "run node_rank=0's notebook with the same master_addr and use_port, and check that this machine can reach it."
        ) from None
    return client, [client], ()


def _wait_listening(host: str, port: int, deadline: float, options: LaunchOptions) -> None:
    """Until node 0's store accepts a connection: plain connects, quiet and interruptible (a TCPStore
    client would block in C++ for the whole join timeout, and log a C++ stack at each retry)."""
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise PreflightError(
                    f"node 0's store at {host}:{port} did not come up within the join timeout; run node_rank=0's notebook_launcher(..., num_nodes={options.num_nodes}) "
                    "with the same master_addr and use_port, and check that this machine can reach it (rdzv_conf={'join_timeout': SECONDS} waits longer)."
                ) from None
            time.sleep(_LOOK_EVERY * 4)


def _c10d(options: LaunchOptions, host: str, port: int, join_timeout: float, local_address: str | None) -> tuple[Any, int, list[Any], tuple[str, int]]:
    """torch elastic's c10d rendezvous: its store, this node's rank (order of arrival), where workers meet."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    conf = {key: value for key, value in options.rdzv_conf if key not in ("rank", "timeout")}
    conf.setdefault("join_timeout", join_timeout)
    if local_address:  # where this node's workers reach it (torch would ask getfqdn, which may name 127.0.1.1)
        conf.setdefault("local_addr", local_address)
    params = RendezvousParameters(
        backend="c10d", endpoint=f"{host}:{port}", run_id=options.rdzv_id, min_nodes=options.num_nodes, max_nodes=options.num_nodes, **conf
    )
    handler = get_rendezvous_handler(params)
    try:
        info = handler.next_rendezvous()
    except Exception as exc:  # noqa: BLE001 - torch's rendezvous errors have no common base worth naming
        raise PreflightError(f"the c10d rendezvous at {host}:{port} (run id {options.rdzv_id!r}) failed: {exc}") from None
    bootstrap = info.bootstrap_store_info
    if bootstrap is None:  # torch 2.13 always builds it; an older torch had no store to share with workers
        raise PreflightError(f"torch's c10d rendezvous at {host}:{port} gave no store for the ranks; use rdzv_backend='static'.")
    return info.store, int(info.rank), [handler, info.store], (str(bootstrap.master_addr), int(bootstrap.master_port))


def _wait_get(store: Any, key: str, deadline: float, options: LaunchOptions, host: str, port: int) -> str:
    """``store.get(key)`` once it is there (looked for every 50 ms, so an interrupt lands at once)."""
    while True:
        try:
            if store.check([key]):
                return bytes(store.get(key)).decode()
        except RuntimeError as exc:  # the store's host went away (node 0's kernel stopped)
            raise PreflightError(f"the rendezvous store at {host}:{port} failed while the nodes met: {exc}") from None
        time.sleep(_LOOK_EVERY)
        if time.monotonic() > deadline:
            node = key.rsplit("/", 1)[-1]
            raise PreflightError(
                f"node {node} did not join at {host}:{port} within the join timeout; run its notebook's notebook_launcher(..., num_nodes={options.num_nodes}, "
                f"node_rank={node}) with the same master_addr and use_port (rdzv_conf={{'join_timeout': SECONDS}} waits longer)."
            )
