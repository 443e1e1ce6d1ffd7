"""The seams of the engine: how a group of ranks is started (``GroupStarter``), what the loop needs of
it (``RankGroup``), and where the loop sends what the ranks say (``Sink``, implemented in
``nbaccel.output``).

Every launch mode goes through them: a one-shot launch asks a ``GroupStarter`` for a group that runs
one job and ends; persistent workers ask for a group that stays and takes commands. The one-node
``LocalGroupStarter`` starts ranks on this machine (fork, the fork server or spawn: the ``RankStarter``); a group starter
for several nodes implements the same two methods, with a ``RankGroup`` whose ranks live on node agents
and whose events arrive over the network instead of pipes. Nothing above this module knows which.

Example::

    group = group_starter.start_group(job, plan, attempt=0, persistent=False)
    try:
        EventLoop(group, sink, OneShot()).run()
    finally:
        group.close()
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from nbaccel.wire.events import Kind
from nbaccel.wire.job import ChildEnds, Job

if TYPE_CHECKING:
    from nbaccel.launch.loop import EventLoop
    from nbaccel.launch.outcome import RankOutcome
    from nbaccel.launch.processes import RankProcess
    from nbaccel.launch.stacks import RankStack
    from nbaccel.wire.shm import Attachments


@dataclass(frozen=True)
class LaunchPlan:
    """Everything about a launch that was decided (and validated) before anything starts."""

    num_processes: int
    device_type: str  # "cpu", "cuda" (NVIDIA, or AMD through a ROCm torch) or "xpu" (Intel)
    gpus: tuple[int, ...] | None  # devices (as the kernel numbers them) the ranks use, one rank each
    gpu_vendor: str = ""  # "nvidia", "amd", "intel": whose tools watch the GPUs; "" on CPU
    mixed_precision: str = "no"
    master_addr: str = "127.0.0.1"
    port: int | None = None  # None: a free port, fresh for every attempt
    max_restarts: int = 0
    timeout: float | None = None  # seconds from the call
    deadline: float | None = None  # time.monotonic() when ``timeout`` runs out
    stall_report: float | None = None  # seconds without output before each rank's stack is shown
    device_notes: tuple[str, ...] = ()  # one line each: a GPU skipped and why, GPUs this torch cannot use
    # TORCHELASTIC_RUN_ID of every rank: one per launch (or pool), kept across restarts as torchrun keeps its rendezvous id
    run_id: str = field(default_factory=lambda: f"nbaccel-{uuid.uuid4().hex[:12]}")


@runtime_checkable
class Sink(Protocol):
    """The interface every output destination implements (text, widgets, log files).

    A sink may also have ``lines_in_cell`` (read with ``getattr``, default False; not a member of
    the protocol, so sinks written before it still fit): True when it prints every rank's lines
    into the cell itself (``[rank 1] ...``). A rank's debugger prompt then shows only the prompt,
    not again what pdb printed above it (``nbaccel.launch.debug_desk``).
    """

    def launch_started(self, num_processes: int, attempt: int, ranks: Sequence[int] | None = None) -> None:
        """A (re)launch of ``num_processes`` ranks begins; ``attempt`` counts from 0.

        ``ranks`` lists the ranks taking part, when not all of them (default: every rank in
        ``range(num_processes)``): a cell on persistent workers run with ``--ranks 1,3``
        announces ``launch_started(4, 0, ranks=[1, 3])``, and only those ranks will finish.
        """

    def output(self, rank: int, stream: str, lines: list[str]) -> None:
        """Whole lines (no trailing newline) that ``rank`` wrote to ``stream`` ("stdout"/"stderr")."""

    def event(self, rank: int, event: dict[str, Any]) -> None:
        """Rich output from ``rank``: display data, progress bars (see nbaccel.wire.events)."""

    def rank_finished(self, outcome: RankOutcome) -> None:
        """``outcome.rank`` has ended (succeeded, failed, stopped ...)."""

    def launch_finished(self, outcomes: list[RankOutcome]) -> None:
        """Every rank has ended (or the launch was given up); flush whatever is buffered.

        Called once after every ``launch_started``, however the launch ended (interrupts,
        timeouts, errors included): the only call that a sink can count on to end its view.
        """

    def tick_in(self) -> float | None:
        """Seconds until the sink wants ``tick()`` called (0: now); None if it wants none."""

    def tick(self) -> None:
        """Do what is due now (push held lines, update a clock); cheap when nothing is."""


class RankGroup(Protocol):
    """The ranks of one attempt (or of a pool's lifetime), as the event loop drives them.

    A group feeds the loop: ``attach`` registers its sources, which then call ``loop.lines``,
    ``loop.event`` and ``loop.exited``. The loop acts on it only through the methods below.
    """

    @property
    def num_processes(self) -> int:
        """How many ranks the group has (all of them, on every node)."""

    def attach(self, loop: EventLoop) -> None:
        """Register every source of rank output, events and exits with ``loop``."""

    def detach(self, loop: EventLoop) -> None:
        """Stop feeding ``loop`` (a pool keeps its group for the next task's loop)."""

    def poll(self) -> float | None:
        """Look for what the sources cannot report by themselves (exits without a pidfd, a node's
        missed heartbeats); the seconds until the next look, or None when nothing needs looking at."""

    def signal(self, sig: int, ranks: Iterable[int]) -> None:
        """Send ``sig`` to those of ``ranks`` still running; never to anything else."""

    def returncode(self, rank: int) -> int | None:
        """``rank``'s exit status once its process ended (negative: killed by that signal), else None.

        Outside a loop this reaps a rank that has ended; a loop learns of exits from its sources.
        """

    def was_signalled(self, rank: int) -> bool:
        """True when nbaccel sent ``rank`` a signal."""

    def last_lines(self, rank: int) -> list[str]:
        """The latest output lines of ``rank``, for error reports."""

    def pid(self, rank: int) -> int:
        """The rank's process id (on its own node)."""

    def stacks(self, ranks: Iterable[int]) -> dict[int, RankStack]:
        """Where each of ``ranks`` still running is: every thread's Python stack, dumped by the rank."""

    def release(self) -> None:
        """Every rank returned: let those waiting to leave their process group go (exit barrier)."""

    @property
    def shares_memory(self) -> bool:
        """Whether big values may travel to the ranks as memfds (``send(..., attached=...)``):
        True for ranks on this machine, False for ranks on nodes (pickled in-band)."""

    def send(self, rank: int, kind: Kind, payload: bytes, attached: Attachments | None = None) -> None:
        """A command to a persistent rank (TASK, STOP), with the memfds its payload names (only
        where ``shares_memory``). Raises OSError when the rank is gone."""

    def close(self) -> None:
        """Kill and reap whatever still runs; free ports, pipes and handles. Idempotent."""


class GroupStarter(ABC):
    """Starts groups of ranks. Implementations own every process they start."""

    start_method: str

    @abstractmethod
    def start_group(self, job: Job, plan: LaunchPlan, attempt: int, persistent: bool) -> RankGroup:
        """Start ``plan.num_processes`` ranks running ``job``; on failure nothing is left behind.

        ``persistent`` groups get a command stream per rank (``RankGroup.send``) and host their
        rendezvous store at once (the ranks join their process group before saying READY).
        """


class RankStarter(Protocol):
    """How one local rank process is created; the rank then runs ``nbaccel.rank.bootstrap.run_rank``."""

    start_method: str

    def start(self, job: Job, rank: int, env: dict[str, str], ends: ChildEnds, close_fds: list[int]) -> int:
        """Create the process for ``rank`` and return its pid (the caller owns it from then on)."""

    def process(self, rank: int, pid: int) -> RankProcess:
        """The handle the group waits on, signals and reaps ``pid`` through (the fork server's
        ranks are not the kernel's children: their exits are relayed)."""

    def release(self) -> None:
        """Every rank of the launch has started: free what starting them needed (the pickled job)."""
