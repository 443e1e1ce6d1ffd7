"""One-node launches: the ``GroupStarter`` that starts every rank on this machine, by fork or spawn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nbaccel.launch.group import LocalRankGroup
from nbaccel.launch.seam import GroupStarter, LaunchPlan, RankStarter
from nbaccel.wire.job import Job

if TYPE_CHECKING:
    from nbaccel.launch.node_world import NodeWorld


class LocalGroupStarter(GroupStarter):
    """Starts every rank on this machine with ``starter`` (fork or spawn); with a ``world``, as
    one node of a ``num_nodes`` launch (its ranks' global numbers, the nodes' store).

    Example::

        group = LocalGroupStarter(ForkStarter()).start_group(job, plan, attempt=0, persistent=False)
    """

    def __init__(self, starter: RankStarter, world: NodeWorld | None = None) -> None:
        self.starter = starter
        self.start_method = starter.start_method
        self.world = world

    def start_group(self, job: Job, plan: LaunchPlan, attempt: int, persistent: bool) -> LocalRankGroup:
        return LocalRankGroup.start(self.starter, job, plan, attempt, persistent, self.world)
