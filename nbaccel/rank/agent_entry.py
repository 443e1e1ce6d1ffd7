"""What a rank on a remote node runs: torch elastic forks it, nbaccel's rank bootstrap takes over.

The agent hands this function to ``torch.distributed.elastic.multiprocessing.start_processes``
(fork). Elastic has already exported the rank's environment; from here on the rank is set up
exactly as a one-node rank is (``nbaccel.worker.run_rank``: own process group, death with its
parent, default signal handlers instead of elastic's inherited SIGTERM handler, stdio and rich
output into its pipes to the agent). The job arrives cloudpickled; it was verified by the agent
before the fork and is unpickled here, in the rank, so a job that cannot be unpickled on this
node is that rank's error, reported like any other.

Example (what the agent passes to start_processes, per local rank)::

    args = {local_rank: (job_bytes, env, child_ends, close_fds, os.getpid())}
"""

from __future__ import annotations

import os
from typing import Any

from nbaccel.rank import process_title
from nbaccel.rank.bootstrap import run_rank
from nbaccel.wire.job import ChildEnds, Job


def run_remote_rank(job_bytes: bytes, env: dict[str, str], ends: ChildEnds, close_fds: list[int], agent_pid: int) -> None:
    """Become the rank described by ``env`` and run the job; never returns (the process exits)."""
    run_rank(Job(_call_pickled, (job_bytes,), pass_ends=True), int(env["RANK"]), env, ends, close_fds, agent_pid)


def _call_pickled(ends: ChildEnds, job_bytes: bytes) -> Any:
    import cloudpickle

    job: Job = cloudpickle.loads(job_bytes)
    if not job.pass_ends:  # a worker's loop names itself
        process_title.name_rank(int(os.environ["RANK"]), os.environ.get("WORLD_SIZE", "1"), job.label or process_title.job_label(job.function))
    args = (ends, *job.args) if job.pass_ends else job.args
    return job.function(*args)
