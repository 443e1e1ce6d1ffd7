"""Whether the ranks of a pool still agree on their process group after a task that did not end well.

Ranks interrupted (or stopped after a peer failed) at different moments may have issued different
numbers of collectives. The group does not notice: the next cell's first collective on one rank
pairs with a leftover one on another, which hangs or, worse, returns wrong numbers. torch counts
the collectives each rank issued on a group (its sequence number, on gloo and nccl alike), so
after such a task every rank is asked for that count; where they differ the group cannot be
trusted and the pool is torn down. The count is asked as ``RankCall.COLLECTIVE_COUNT``
(``nbaccel.wire.rank_calls``): the rank answers it with its own code.

Example:
    >>> out_of_step({0: 4, 1: 4}) is None
    True
    >>> out_of_step({0: 5, 1: 4})
    'the ranks issued different numbers of collectives (rank 0: 5, rank 1: 4), so the next cell would pair the wrong ones'
"""

from __future__ import annotations


def out_of_step(counts: dict[int, int | None]) -> str | None:
    """One line saying why the ranks' group is out of step, or None when every count agrees.

    Ranks without a count (no group, a backend that keeps none) are left out of the comparison.
    """
    known = {rank: count for rank, count in sorted(counts.items()) if count is not None}
    if len(set(known.values())) <= 1:
        return None
    listed = ", ".join(f"rank {rank}: {count}" for rank, count in known.items())
    return f"the ranks issued different numbers of collectives ({listed}), so the next cell would pair the wrong ones"
