"""A failure on some node, named by its node: what ``notebook_launcher(..., cluster=)`` and a pool
on a cluster raise when a rank fails.

Example::

    try:
        notebook_launcher(train, cluster=cluster)
    except NodeRankFailedError as error:
        error.node     # "node 1 (10.0.0.2)"
"""

from __future__ import annotations

from collections.abc import Sequence

from nbaccel.cluster.group import ClusterGroupStarter
from nbaccel.errors import RankFailedError, RankReport

__all__ = ["NodeRankFailedError", "naming_nodes"]


class NodeRankFailedError(RankFailedError):
    """A rank on some node failed; the message names the rank and its node first."""

    def __init__(self, root: RankReport, outcomes: Sequence[RankReport], where: dict[int, str]) -> None:
        self.where = where
        self.node = where.get(root.rank, "")
        super().__init__(root, outcomes)

    def _headline(self, root: RankReport) -> str:  # type: ignore[override]
        # Called from RankFailedError.__init__, after ``where`` is set; the outcome words it.
        return root.headline(node=getattr(self, "where", {}).get(root.rank, ""))

    def _render_traceback_(self) -> list[str]:
        lines = self.report().splitlines()
        return [f"NodeRankFailedError: {lines[0]}", *lines[1:]]


def naming_nodes(error: RankFailedError, group_starter: ClusterGroupStarter) -> NodeRankFailedError:
    """``error`` again, its headline naming the node of its rank."""
    group = group_starter.last_group
    where = {rank: group.where(rank) for rank in range(group.num_processes)} if group is not None else {}
    root = next(o for o in error.outcomes if o.rank == error.rank)
    renamed = NodeRankFailedError(root, error.outcomes, where)
    renamed.attempts = error.attempts
    return renamed
