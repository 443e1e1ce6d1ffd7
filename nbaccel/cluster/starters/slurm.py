"""Agents started by Slurm: ``srun`` inside an allocation, or a submitted job whose steps are the agents.

Inside an allocation (``SLURM_JOB_ID`` set: the kernel runs on a node of a ``salloc``/``sbatch``
job) one ``srun`` starts one agent per node. From a login node, ``sbatch`` submits a job whose
batch script runs that ``srun``; while the cluster waits it says where the job is queued
(``squeue``'s state and reason), and closing the cluster cancels the job. Either way each agent
reports ``SLURM_NODEID``, and node ranks follow Slurm's node order. The agents read the secret
from the token file, which must be on a filesystem the nodes share (``Cluster(token_dir=...)``,
by default a private folder in the home directory).

Example::

    cluster.start_agents(via="slurm", nodes=2, gpus_per_node=4, time="04:00:00", partition="gpu")
"""

from __future__ import annotations

import os
import shlex
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from nbaccel.cluster.starters.base import AgentStart, ProcessStart, agent_argv, output_tail

_SQUEUE_EVERY = 0.5  # seconds between queue looks while waiting: squeue is cheap, a missed start is not
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


def job_options(nodes: int, gpus_per_node: int | None, time_limit: str | None, partition: str | None, extra: Sequence[str] | str) -> list[str]:
    """The job's options, as ``sbatch`` and ``srun`` both take them.

    Example:
        >>> job_options(2, 4, "01:00:00", "gpu", "--account=ml")
        ['--nodes=2', '--ntasks-per-node=1', '--gpus-per-node=4', '--time=01:00:00', '--partition=gpu', '--account=ml']
    """
    if not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes={nodes!r}: give how many nodes the job runs an agent on (at least 1).")
    options = [f"--nodes={nodes}", "--ntasks-per-node=1"]
    options += [] if gpus_per_node is None else [f"--gpus-per-node={gpus_per_node}"]
    options += [] if time_limit is None else [f"--time={time_limit}"]
    options += [] if partition is None else [f"--partition={partition}"]
    return [*options, *(shlex.split(extra) if isinstance(extra, str) else extra)]


def start_in_allocation(
    nodes: int | None, address: str, token_file: str, *, agent: str | list[str] | None, nproc_per_node: int | None, extra: Sequence[str] | str = ()
) -> ProcessStart:
    """``srun`` one agent on each of ``nodes`` nodes of the current allocation (default: all of them)."""
    job = os.environ["SLURM_JOB_ID"]
    count = nodes if nodes is not None else int(os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    label = f"slurm job {job}"
    # --overlap: the notebook's own step (srun --pty jupyter ...) may hold the allocation's CPUs.
    srun = ["srun", "--overlap", "--kill-on-bad-exit=0", f"--ntasks={count}", *job_options(count, None, None, None, extra)]
    return ProcessStart(label, [*srun, *agent_argv(agent, address, label, nproc_per_node, f"file:{token_file}")], expected=count)


class SubmittedJob(AgentStart):
    """A batch job whose one step is an agent per node; watched with ``squeue``, ended with ``scancel``."""

    def __init__(self, options: list[str], nodes: int, address: str, token_file: str, *, agent: str | list[str] | None, nproc_per_node: int | None) -> None:
        folder = Path(token_file).parent  # private, and on the shared filesystem the nodes see
        self.expected, self.started_at = nodes, time.monotonic()
        self.script = folder / f"{Path(token_file).stem}.sbatch"
        self.log = folder / f"{Path(token_file).stem}.slurm.out"
        self._argv = agent_argv(agent, address, "slurm job $SLURM_JOB_ID", nproc_per_node, f"file:{token_file}")
        fd = os.open(self.script, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "w") as handle:
            handle.write(batch_script(self._argv))
        submitted = _run(["sbatch", "--parsable", "--job-name=nbaccel-agents", f"--output={self.log}", *options, str(self.script)])
        self.job = submitted.split(";")[0].strip()
        self.label = f"slurm job {self.job}"
        self._checked, self._state = 0.0, ("PENDING", "")

    def _look(self) -> tuple[str, str]:
        now = time.monotonic()
        if now - self._checked >= _SQUEUE_EVERY:
            self._checked = now
            listed = subprocess.run(["squeue", "-h", "-j", self.job, "-o", "%T|%R"], check=False, capture_output=True, text=True, timeout=30)
            state, _, reason = listed.stdout.strip().partition("|")
            self._state = (state or "ENDED", reason)
        return self._state

    def progress(self) -> str | None:
        state, reason = self._look()
        reason = reason.strip("()")
        return f"{self.label}: {state}" + (f" ({reason})" if reason and reason != "None" else "")

    def failure(self) -> str | None:
        state = self._look()[0]
        if state not in ("ENDED", *_ENDED):
            return None
        said = output_tail(self.log.read_bytes()) if self.log.exists() else ""
        return f"{self.label} ended ({state}) before its agents joined" + (f": {said}" if said else "")

    def stop(self, grace: float) -> None:
        """Cancel the job (the agents have been told to exit; what lingers is ended by Slurm)."""
        # A bounded poll, because Slurm's tools have no blocking wait for another process's job to
        # end: `sbatch --wait` waits only on the job it submits, and itself polls the controller with
        # a doubling sleep (2 to 10 s to notice the end); `scontrol wait_job` returns once the job is
        # running; `strigger --fini` runs a program on the controller's host, not here. One squeue
        # each _SQUEUE_EVERY (the controller answers in tens of ms), for `grace` at most (research: clusters.md).
        deadline = time.monotonic() + grace
        while self._look()[0] not in ("ENDED", *_ENDED):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(_SQUEUE_EVERY, left))
        subprocess.run(["scancel", self.job], check=False, capture_output=True, timeout=30)
        for path in (self.script, self.log):
            path.unlink(missing_ok=True)

    def __repr__(self) -> str:
        return f"<SubmittedJob {self.label}: {self.progress()}>"


def batch_script(agent: list[str]) -> str:
    """The job's script: one ``srun`` step, one agent per node (``$SLURM_JOB_ID`` left to the shell).

    Example:
        >>> print(batch_script(["nbaccel-agent", "10.0.0.1:1", "--started-by", "slurm job $SLURM_JOB_ID"]))
        #!/bin/sh
        exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 nbaccel-agent 10.0.0.1:1 --started-by "slurm job $SLURM_JOB_ID"
        <BLANKLINE>
    """
    words = [f'"{w}"' if "$SLURM_JOB_ID" in w else shlex.quote(w) for w in agent]
    return "#!/bin/sh\nexec srun --ntasks-per-node=1 --kill-on-bad-exit=0 " + " ".join(words) + "\n"


def _run(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise OSError(
            f"{argv[0]} is not on the kernel's PATH: run the notebook where Slurm's commands are (a login node), or start the agents another way."
        ) from None
    if done.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv[:1])} refused the job (exit code {done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def start_by_slurm(
    address: str,
    token_file: str,
    *,
    agent: str | list[str] | None,
    nproc_per_node: int | None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    time_limit: str | None = None,
    partition: str | None = None,
    sbatch_options: Sequence[str] | str = (),
) -> AgentStart:
    """Inside an allocation: srun there; else submit a job of ``nodes`` nodes."""
    if os.environ.get("SLURM_JOB_ID"):
        if gpus_per_node is not None or time_limit is not None or partition is not None:
            raise ValueError(
                "gpus_per_node, time and partition are the allocation's already (SLURM_JOB_ID is set): leave them out, or start the notebook on a login node to submit a new job."
            )
        return start_in_allocation(nodes, address, token_file, agent=agent, nproc_per_node=nproc_per_node, extra=sbatch_options)
    if nodes is None:
        raise ValueError("via='slurm' outside an allocation submits a job: say how many nodes (nodes=2).")
    return SubmittedJob(
        job_options(nodes, gpus_per_node, time_limit, partition, sbatch_options), nodes, address, token_file, agent=agent, nproc_per_node=nproc_per_node
    )
