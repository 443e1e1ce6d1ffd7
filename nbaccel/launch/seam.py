"""The seams between ``notebook_launcher`` and the ways of starting ranks.

``Launcher`` runs one attempt of a launch and reports every rank's outcome; ``LocalLauncher``
(one node: fork or spawn) implements it today, and a multi-node launcher built on torch
elastic's rendezvous is meant to implement the same interface. ``RankStarter`` is the smaller
seam inside a local launch: how one rank process comes to exist (``os.fork`` or a fresh
interpreter).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol

from nbaccel.launch.outcome import RankOutcome
from nbaccel.output.sinks import Sink
from nbaccel.rank.bootstrap import ChildEnds, Job


@dataclass(frozen=True)
class LaunchPlan:
    """Everything about a launch that was decided (and validated) before anything starts."""

    num_processes: int
    device_type: str  # "cpu" or "cuda"
    gpus: tuple[int, ...] | None  # CUDA devices the ranks may see, one rank each
    mixed_precision: str = "no"
    master_addr: str = "127.0.0.1"
    port: int | None = None  # None: a free port, fresh for every attempt
    max_restarts: int = 0
    timeout: float | None = None  # seconds from the call
    deadline: float | None = None  # time.monotonic() when ``timeout`` runs out


class Launcher(ABC):
    """Runs one attempt of a launch. Implementations own every process they start."""

    start_method: str

    @abstractmethod
    def run_attempt(self, job: Job, plan: LaunchPlan, attempt: int, sink: Sink) -> list[RankOutcome]:
        """Start every rank, relay their output to ``sink``, and return their outcomes, by rank.

        Calls ``sink.launch_started`` first and ``sink.launch_finished`` last, however it ends.
        Returns when every rank has ended and been reaped. Raises KeyboardInterrupt (after
        stopping every rank) if interrupted, and LaunchTimeoutError when ``plan.deadline`` passes.
        """


class RankStarter(Protocol):
    """How one rank process is created; the rank then runs ``nbaccel.rank.bootstrap.run_rank``."""

    start_method: str

    def start(self, job: Job, rank: int, env: dict[str, str], ends: ChildEnds, close_fds: list[int]) -> int:
        """Create the process for ``rank`` and return its pid (the caller owns it from then on)."""
