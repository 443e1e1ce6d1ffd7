"""Entry point of a spawned rank: read the job from stdin, then run it like a forked rank."""

from __future__ import annotations

import os
import pickle
import sys


def main() -> None:
    payload = sys.stdin.buffer.read()  # first, so the kernel's write never waits on our imports
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    spec = pickle.loads(payload)  # bytes from our own parent, over a private pipe

    from nbaccel.rank.bootstrap import run_rank
    from nbaccel.wire import shm
    from nbaccel.wire.job import CHANNEL_FD, COMMANDS_FD, SHARED_FD, ChildEnds

    tag, attached = spec["attached"]
    shm.expect(tag, attached)

    ends = ChildEnds(1, 2, CHANNEL_FD, COMMANDS_FD if spec["commands"] else None, SHARED_FD if spec.get("shared") else None)
    run_rank(spec["job"], spec["rank"], spec["env"], ends, [], spec["parent_pid"])


if __name__ == "__main__":
    main()
