"""One-node launches: one RankGroup per attempt, watched by a Supervisor until every rank ends."""

from __future__ import annotations

from nbaccel.launch.outcome import RankOutcome
from nbaccel.output.sinks import Sink
from nbaccel.launch.one_shot import Supervisor
from nbaccel.rank.bootstrap import Job
from nbaccel.launch.seam import LaunchPlan, Launcher, RankStarter
from nbaccel.launch.group import RankGroup


class LocalLauncher(Launcher):
    """Starts every rank on this machine with ``starter`` (fork or spawn) and supervises them.

    Example::

        outcomes = LocalLauncher(ForkStarter()).run_attempt(job, plan, attempt=0, sink=TextSink())
    """

    def __init__(self, starter: RankStarter) -> None:
        self.starter = starter
        self.start_method = starter.start_method

    def run_attempt(self, job: Job, plan: LaunchPlan, attempt: int, sink: Sink) -> list[RankOutcome]:
        sink.launch_started(plan.num_processes, attempt)
        group = RankGroup.start(self.starter, job, plan, attempt, with_commands=True, store_now=False)
        supervisor = Supervisor(group.processes, group.pipes, sink, plan.deadline, plan.timeout)
        try:
            group.start_store_on_first_connection(supervisor)
            return supervisor.run()
        finally:
            group.close()
            sink.launch_finished(supervisor.outcomes)  # also after an interrupt or a timeout
