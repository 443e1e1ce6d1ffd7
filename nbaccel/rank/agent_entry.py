"""What a rank a node agent forked runs: the launch's job, unpickled in the rank itself.

The agent starts its ranks as one node's are (``LocalRankGroup`` and the ``ForkStarter``): the
rank's bootstrap (``nbaccel.rank.bootstrap.run_rank``: own process group, death with its parent,
default signal handlers, stdio and rich output into its pipes to the agent) runs this job. The
launch's job arrives cloudpickled; it was verified by the agent before the fork and is unpickled
here, in the rank, so a job that cannot be unpickled on this node is that rank's error, reported
like any other, and the agent never unpickles anything.

Example (what the agent starts on each local rank)::

    group = LocalRankGroup.start_node(ForkStarter(), remote_job(job_bytes), environments, ...)
"""

from __future__ import annotations

import os
from typing import Any

from nbaccel.rank import process_title
from nbaccel.wire.job import ChildEnds, Job, job_label


def remote_job(job_bytes: bytes) -> Job:
    """The job a node's rank runs: unpickle the launch's job there, then call it.

    Example:
        >>> remote_job(b"...").args
        (b'...',)
    """
    return Job(_call_pickled, (job_bytes,), pass_ends=True)


def _call_pickled(ends: ChildEnds, job_bytes: bytes) -> Any:
    import cloudpickle

    job: Job = cloudpickle.loads(job_bytes)
    if not job.pass_ends:  # a worker's loop names itself
        process_title.name_rank(int(os.environ["RANK"]), os.environ.get("WORLD_SIZE", "1"), job.label or job_label(job.function))
    args = (ends, *job.args) if job.pass_ends else job.args
    return job.function(*args)
