"""Start a rank as a fresh interpreter, for kernels where forking is unsafe (CUDA already initialised).

The job travels as cloudpickle bytes over the child's stdin, so functions defined in a notebook
work (plain ``spawn`` cannot import them from ``__main__``). The function keeps its file name and
source (nbaccel.wire.portable), so errors still show the notebook's lines. It is pickled once per
launch (``PickledJobs``), not once per rank, and loaded after the rank pinned its device.
"""

from __future__ import annotations

import os
import pickle
import sys

from nbaccel.launch.notices import say
from nbaccel.launch.processes import RankProcess
from nbaccel.wire.job import ATTACHED_FD, CHANNEL_FD, COMMANDS_FD, SHARED_FD, ChildEnds, Job
from nbaccel.wire.job_pickle import dump_job
from nbaccel.wire.shm import Attachments


class PickledJobs:
    """The bytes of the last job pickled: every rank of a launch gets the same ones."""

    def __init__(self) -> None:
        self._job: Job | None = None
        self._payload = b""
        self.attached = Attachments()  # memfds of the job's big tensors and arrays, for every rank

    def payload(self, job: Job) -> bytes:
        if job is not self._job:
            gpu_tensors: list[str] = []
            self.attached.close()
            self.attached = Attachments()
            self._payload = dump_job(job, gpu_tensors, self.attached)
            self._job = job
            if gpu_tensors:  # one line per launch
                say(
                    f"the function holds {len(gpu_tensors)} CUDA tensor(s) ({'; '.join(gpu_tensors[:3])}{'; ...' if len(gpu_tensors) > 3 else ''}); each rank gets a copy on its own GPU"
                )
        return self._payload

    def release(self) -> None:
        """The launch has started: forget the bytes (a restart pickles again, the job may differ)."""
        self._job, self._payload = None, b""
        self.attached.close()  # every rank has its own fds


class SpawnStarter:
    """Starts ``python -m nbaccel.rank.spawn_entry`` and hands it the job.

    Example::

        pid = SpawnStarter().start(job, rank=0, env=env, ends=ends, close_fds=[])
    """

    start_method = "spawn"

    def __init__(self) -> None:
        self.jobs = PickledJobs()

    def process(self, rank: int, pid: int) -> RankProcess:
        return RankProcess(rank, pid)

    def release(self) -> None:
        self.jobs.release()

    def start(self, job: Job, rank: int, env: dict[str, str], ends: ChildEnds, close_fds: list[int]) -> int:
        job_bytes = self.jobs.payload(job)
        attached = self.jobs.attached
        first = ATTACHED_FD
        spec = {
            "attached": (attached.tag, list(range(first, first + len(attached.fds)))),
            "job": job_bytes,
            "rank": rank,
            "env": env,
            "parent_pid": os.getpid(),
            "commands": ends.commands is not None,
            "shared": ends.shared is not None,
        }
        payload = pickle.dumps(spec, protocol=pickle.HIGHEST_PROTOCOL)
        actions = [
            (os.POSIX_SPAWN_DUP2, ends.stdout, 1),
            (os.POSIX_SPAWN_DUP2, ends.stderr, 2),
            (os.POSIX_SPAWN_DUP2, ends.channel, CHANNEL_FD),
        ]
        if ends.commands is not None:
            actions.append((os.POSIX_SPAWN_DUP2, ends.commands, COMMANDS_FD))
        if ends.shared is not None:
            actions.append((os.POSIX_SPAWN_DUP2, ends.shared, SHARED_FD))
        actions += [(os.POSIX_SPAWN_DUP2, fd, first + i) for i, fd in enumerate(attached.fds)]
        payload_r, payload_w = os.pipe()
        try:
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-m", "nbaccel.rank.spawn_entry"],
                _child_environment(env),
                file_actions=[(os.POSIX_SPAWN_DUP2, payload_r, 0), *actions],
                setsid=True,  # its own session and pgid, like a forked rank's
            )
        finally:
            os.close(payload_r)
        try:
            with open(payload_w, "wb", closefd=True) as pipe:
                pipe.write(payload)
        except BrokenPipeError:  # the rank died at start-up; its exit status tells the kernel
            pass
        return pid


def _child_environment(env: dict[str, str]) -> dict[str, str]:
    merged = dict(os.environ)
    merged.update(env)
    # The kernel may import from places only its sys.path knows (the notebook's folder).
    merged["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
    return merged
