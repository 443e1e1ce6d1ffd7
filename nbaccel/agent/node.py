"""The node agent: joins a kernel's cluster, heartbeats, and runs its launches' ranks on this node.

One thread, one selector: the kernel's connection, every local rank's pipes and process
sentinels, and timers (heartbeats, the kernel's silence, escalating signals). The agent never
unpickles anything: it verifies what the kernel sends, forks the ranks (which unpickle the job),
and forwards their output as it came.

Example::

    agent = NodeAgent("10.0.0.1:29400", secret, nproc_per_node=2)
    raise SystemExit(agent.run())
"""

from __future__ import annotations

import gc
import multiprocessing.connection
import os
import selectors
import signal
import socket
import sys
import time
from typing import Any

from nbaccel import _version
from nbaccel.agent.interfaces import interface_of
from nbaccel.agent.node_ranks import NodeRanks
from nbaccel.devices.inventory import gpu_inventory
from nbaccel.launch import warm
from nbaccel.net import clock, protocol
from nbaccel.net.link import Link, new_nonce, split_address
from nbaccel.net.signing import Message
from nbaccel.rank import process_title

EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_KERNEL_LOST = 0, 2, 3, 4
_CONNECT_TIMEOUT = 10.0
_SIGNALS_THE_KERNEL_MAY_SEND = (signal.SIGINT, signal.SIGTERM, signal.SIGKILL)


class AgentError(Exception):
    """A one-line reason the agent cannot go on (printed as ``nbaccel-agent: ...``)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def visible_gpus() -> int:
    """How many GPUs this node's torch can drive (``node_devices``' count)."""
    return node_devices()[0]


def node_devices() -> tuple[int, str]:
    """This node's usable GPUs and their torch device type ("cuda", "xpu"; "cpu" without any),
    from the kernel's one GPU map: the agent never initialises CUDA, HIP or Level Zero.

    The agent forks its ranks, so no GPU runtime may start in it; no GPU its torch can drive
    means 0. A broken NVML is not hidden as "no GPU" (that would quietly turn the node to CPU): it raises.
    """
    # torch now, before the loop runs: the first launch's torch elastic would import it (seconds
    # on a busy machine, long enough to miss heartbeats), and forked ranks inherit it. No CUDA.
    import torch  # noqa: F401

    found = gpu_inventory()  # a CPU-only torch counts no GPU, a ROCm one AMD's, an XPU one Intel's
    return len(found.devices), found.device_type if found.devices else "cpu"


def launcher_facts(started_by: str, order: int | None = None, environ: dict[str, str] | None = None) -> dict[str, Any]:
    """What the join says about how this agent was started, and its place in the node ranks
    (``order``: the host's place in start_agents' list; Slurm's node order when under srun).

    Example:
        >>> launcher_facts("slurm job 7", None, {"SLURM_NODEID": "1", "SLURM_JOB_ID": "7"})
        {'started_by': 'slurm job 7', 'order': 1, 'slurm_job': '7'}
    """
    environ = dict(os.environ) if environ is None else environ
    facts: dict[str, Any] = {"started_by": started_by, **({} if order is None else {"order": order})}
    if environ.get("SLURM_NODEID", "").isdigit():  # an srun step: node ranks follow Slurm's node order
        facts["order"] = int(environ["SLURM_NODEID"])
        facts["slurm_job"] = environ.get("SLURM_JOB_ID", "")
        facts["started_by"] = started_by or f"slurm job {facts['slurm_job']}"
    return facts


class NodeAgent:
    """One node's agent; ``run()`` returns the process's exit code."""

    def __init__(
        self, address: str, secret: bytes, nproc_per_node: int | None = None, started_by: str = "", order: int | None = None, name_process: bool = False
    ) -> None:
        self.address = address
        self.name_process = name_process  # the agent is this process (nbaccel-agent), not a test's object: say so in ps
        self.started_by, self.order = started_by, order
        self.host, self.port = split_address(address)
        self._secret = secret
        self.gpus, self.device_type = node_devices()
        self.nproc = nproc_per_node or max(self.gpus, 1)
        self.link: Link | None = None
        self.ranks: NodeRanks | None = None
        self._selector = selectors.DefaultSelector()
        self._last_heard = time.monotonic()
        self._next_heartbeat = 0.0
        self._closing = False
        self._early: list[Message] = []

    # -- connecting ----------------------------------------------------------------------------

    def connect(self) -> None:
        """Connect and authenticate both ways; AgentError with a clear reason otherwise."""
        try:
            sock = socket.create_connection((self.host, self.port), timeout=_CONNECT_TIMEOUT)
        except OSError as exc:
            raise AgentError(
                f"cannot reach the cluster at {self.address} ({exc.strerror or exc}); is the notebook's Cluster running, and is that address reachable from this node?",
                EXIT_UNREACHABLE,
            ) from None
        link = Link(sock, self._secret, sender=f"node@{socket.gethostname()}:{os.getpid()}")
        hello = self._first_messages(link)[0]  # the kernel sends nothing else before our join
        session = f"{hello.header['session']}.{new_nonce()}"
        link.start_session(session)
        local_address = sock.getsockname()[0]
        self.interface = interface_of(local_address)
        join = {
            "host": socket.gethostname(),
            "address": local_address,
            "nproc": self.nproc,
            "gpus": self.gpus,
            "device_type": self.device_type,
            "pid": os.getpid(),
            "version": _version.__version__,
        }
        link.send(protocol.JOIN, {**join, **launcher_facts(self.started_by, self.order)})
        welcome, *self._early = self._first_messages(link)  # a launch may come in the welcome's read
        if welcome.kind == protocol.REFUSED:
            raise AgentError(f"the cluster at {self.address} refused this node: {welcome.json().get('reason', '?')}", EXIT_REFUSED)
        if welcome.kind != protocol.WELCOME:
            raise AgentError(f"the cluster at {self.address} did not accept this node ({welcome.kind})", EXIT_REFUSED)
        self.node = welcome.json()
        self.link = link
        if self.name_process:
            process_title.name_agent(str(self.node.get("node", "?")), self.address)

    def _first_messages(self, link: Link) -> list[Message]:
        deadline = time.monotonic() + _CONNECT_TIMEOUT
        while time.monotonic() < deadline:
            try:
                messages = link.receive()
            except EOFError as exc:
                self._prove_token_anyway(link)
                raise AgentError(
                    f"the cluster at {self.address} refused this node: {exc}. Check that the token is this cluster's (cluster.token_file).", EXIT_REFUSED
                ) from None
            if messages:
                return messages
        raise AgentError(f"the cluster at {self.address} sent nothing within {_CONNECT_TIMEOUT:.0f} s; is it an nbaccel Cluster?", EXIT_REFUSED)

    def _prove_token_anyway(self, link: Link) -> None:
        """After a bad hello, still send a join so the kernel can say the token is wrong."""
        try:
            link.start_session("refused")
            link.send(protocol.JOIN, {"host": socket.gethostname(), "refused": True})
        except OSError:
            pass

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        """Join, then serve launches until the cluster closes or the kernel is lost."""
        try:
            if self.link is None:
                self.connect()
            assert self.link is not None
            self._selector.register(self.link.fileno(), selectors.EVENT_READ, self._on_kernel)
            self._last_heard = time.monotonic()
            for message in self._early:  # what arrived with the welcome (a launch sent at once)
                code = self._handle(message)
                if code is not None:
                    return code
            return self._loop()
        except AgentError as exc:
            print(f"nbaccel-agent: {exc}", file=sys.stderr, flush=True)
            return exc.exit_code
        except BaseException as exc:  # KeyboardInterrupt, elastic's SignalException (SIGTERM)
            if not isinstance(exc, (KeyboardInterrupt, SystemExit)) and type(exc).__name__ != "SignalException":
                raise
            return EXIT_OK
        finally:
            self._shut_down()

    def _loop(self) -> int:
        while True:
            now = time.monotonic()
            if now - self._last_heard > protocol.KERNEL_LOST_AFTER:
                print(
                    f"nbaccel-agent: the kernel at {self.address} has been silent for {protocol.KERNEL_LOST_AFTER:.0f} s; stopping this node's ranks and exiting",
                    file=sys.stderr,
                    flush=True,
                )
                return EXIT_KERNEL_LOST
            if now >= self._next_heartbeat:
                self._send(protocol.HEARTBEAT)
                self._next_heartbeat = now + protocol.HEARTBEAT_EVERY
            for key, _ in self._selector.select(self._wait_time()):
                code = key.data()
                if code is False:
                    self._selector.unregister(key.fd)
                elif code is not True and code is not None:
                    return int(code)
            if self.ranks is not None:
                self.ranks.on_clock(time.monotonic())
                if self.ranks.done:
                    self._finish_launch()

    def _wait_time(self) -> float:
        moments = [self._next_heartbeat]
        if self.ranks is not None and self.ranks.next_signal_at() is not None:
            moments.append(self.ranks.next_signal_at() or 0.0)
        return max(0.0, min(moments) - time.monotonic())

    def _send(self, kind: str, body: Any = None, launch: str | None = None, raw: bytes | None = None) -> None:
        assert self.link is not None
        try:
            self.link.send(kind, body, launch, raw)
        except OSError:
            pass  # the kernel is gone: its silence ends the loop

    def _on_kernel(self) -> bool | int:
        assert self.link is not None
        try:
            messages = self.link.receive()
        except EOFError:
            print(f"nbaccel-agent: the connection to the kernel at {self.address} closed; stopping this node's ranks and exiting", file=sys.stderr, flush=True)
            return EXIT_KERNEL_LOST
        self._last_heard = time.monotonic()
        received_ns = clock.now_ns()  # as soon as read: a clock probe's t1 (nbaccel.net.clock)
        for message in messages:
            code = self._handle(message, received_ns)
            if code is not None:
                return code
        return True

    def _handle(self, message: Message, received_ns: int | None = None) -> int | None:
        kind = message.kind
        if kind in (protocol.HEARTBEAT, protocol.CLOCK):
            self._answer_probe(message, clock.now_ns() if received_ns is None else received_ns)
        elif kind == protocol.LAUNCH:
            self._start_launch(message)
        elif kind == protocol.CLOSE:
            return EXIT_OK
        elif self.ranks is not None and message.launch == self.ranks.launch:
            body = (message.json() or {}) if kind != protocol.COMMAND else {}
            if kind == protocol.STOP:
                self.ranks.stop(body.get("reason", "stopped"), body.get("spare"))
            elif kind == protocol.RELEASE:
                self.ranks.release()
            elif kind == protocol.COMMAND:
                rank, frame_kind, payload = protocol.unpack_frame(message.payload)
                self.ranks.command(rank, frame_kind, payload)
            elif kind == protocol.STACKS:
                self._send(protocol.STACKS, {"stacks": self.ranks.stacks([int(r) for r in body.get("ranks", [])])}, message.launch)
            elif kind == protocol.SIGNAL and int(body.get("signal", 0)) in _SIGNALS_THE_KERNEL_MAY_SEND:
                self.ranks.signal_ranks([int(r) for r in body.get("ranks", [])], int(body["signal"]))
        return None

    def _answer_probe(self, message: Message, received_ns: int) -> None:
        """The kernel's clock probe (its heartbeats carry one): this node's times, at once."""
        probe = message.json()
        if isinstance(probe, dict) and isinstance(probe.get("t0"), int):
            self._send(protocol.CLOCK, clock.answer(probe, received_ns))

    # -- launches ------------------------------------------------------------------------------

    def _start_launch(self, message: Message) -> None:
        spec, job_bytes = protocol.unpack_mixed(message.payload)
        launch = spec["launch"]
        if self.ranks is not None:  # the kernel never overlaps launches; refuse rather than mix them
            self._send(protocol.FAILED, {"message": "a previous launch is still running on this node"}, launch)
            return
        assert self.link is not None

        def emit(kind: str, body: Any = None, raw: bytes | None = None) -> None:
            self._send(kind, body, launch, raw)

        ranks = NodeRanks(spec, job_bytes, emit, self.interface, close_fds=[self.link.fileno(), self._selector.fileno()])
        try:
            ranks.start()
        except Exception as exc:  # noqa: BLE001 - reported to the kernel, which fails the launch
            ranks.kill_and_close()
            self._send(protocol.FAILED, {"message": f"{type(exc).__name__}: {exc}"}, launch)
            return
        self.ranks = ranks
        for fd, handler in ranks.readers():
            self._selector.register(fd, selectors.EVENT_READ, handler)
        self._send(protocol.STARTED, {"pids": [p.pid for p in ranks.processes]}, launch)

    def _finish_launch(self) -> None:
        assert self.ranks is not None
        ranks, self.ranks = self.ranks, None
        for fd, _ in ranks.readers():
            if fd in self._selector.get_map():
                self._selector.unregister(fd)
        ranks.kill_and_close()
        self._send(protocol.FINISHED, None, ranks.launch)
        warm.import_noted()  # modules the ranks had to import (torch._dynamo): later forks inherit them
        gc.collect()  # while idle: the next launch forks from a clean heap (see NodeRanks.start)

    def _shut_down(self) -> None:
        """Stop this node's ranks (as on a failure: SIGTERM, then SIGKILL) and release everything."""
        if self.ranks is not None:
            self._stop_ranks_now()
        if self.link is not None:
            self.link.close()
        self._selector.close()

    def _stop_ranks_now(self, grace: float = 1.0) -> None:
        assert self.ranks is not None
        self.ranks.stop("closing")
        deadline = time.monotonic() + grace
        running = [p for p in self.ranks.processes if p.exitcode is None]
        while running and time.monotonic() < deadline:  # woken by each exit, not by a clock
            multiprocessing.connection.wait([p.sentinel for p in running], deadline - time.monotonic())
            running = [p for p in running if p.exitcode is None]
        self.ranks.kill_and_close()
        self.ranks = None
