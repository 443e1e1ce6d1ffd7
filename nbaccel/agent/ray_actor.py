"""A node agent hosted by a Ray actor: what ``cluster.start_agents(via="ray")`` places in each bundle.

The actor's process belongs to Ray (a worker with Ray's gRPC threads), so the ranks are not forked
from it: the actor starts the ordinary agent, ``python -m nbaccel.agent``, as its child, with the
actor's environment (Ray's ``CUDA_VISIBLE_DEVICES``: the GPUs Ray assigned to this bundle are the
node's GPUs) and the cluster's secret on the agent's standard input (``--token-stdin``), never in
an argument or an environment. The agent dies with the actor (``--parent-pid``: ``PR_SET_PDEATHSIG``),
so an actor killed by ``ray.kill``, by its driver's end or by its node's raylet dying takes the
agent, and through it the ranks, along. ``run()`` blocks until the agent ends and returns its
exit code and the tail of what it printed (for ``cluster.wait()``'s error).

Only the standard library is imported here: the kernel names this class to Ray (Ray places an
actor by its class) without loading the agent's machinery.

Example (what the kernel's starter does, nbaccel/cluster/starters/ray.py)::

    actor = ray.remote(RayNodeAgent).options(num_gpus=1, scheduling_strategy=...).remote(
        "10.0.0.1:29400", secret_hex, nproc_per_node=None, started_by="ray placement group 1a2b", order=0)
    code, tail = ray.get(actor.run.remote())
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile

_PR_SET_PDEATHSIG = 1
_TAIL_BYTES = 4096
_TAIL_LINES = 6


def die_with_parent(parent_pid: int) -> None:
    """Get SIGTERM when the parent (the actor) dies; exit now if it died already.

    The agent stops its ranks on SIGTERM once torch elastic's handler is in, and its ranks die
    with it either way (they have their own ``PR_SET_PDEATHSIG``).
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # it died before prctl took effect
        raise SystemExit(4)


def agent_words(address: str, started_by: str, order: int | None, nproc_per_node: int | None, parent_pid: int) -> list[str]:
    """The agent's command line in the actor (this interpreter: Ray's worker Python on the node).

    Example:
        >>> agent_words("10.0.0.1:1", "ray placement group ab12", 0, None, 42)[1:]
        ['-m', 'nbaccel.agent', '10.0.0.1:1', '--token-stdin', '--started-by', 'ray placement group ab12', '--order', '0', '--parent-pid', '42']
    """
    words = [sys.executable, "-m", "nbaccel.agent", address, "--token-stdin", "--started-by", started_by]
    words += [] if order is None else ["--order", str(order)]
    words += [] if nproc_per_node is None else ["--nproc-per-node", str(nproc_per_node)]
    return [*words, "--parent-pid", str(parent_pid)]


class RayNodeAgent:
    """One node agent per placement-group bundle; Ray calls ``__init__`` in the actor's process."""

    def __init__(self, address: str, secret_hex: str, nproc_per_node: int | None, started_by: str, order: int | None) -> None:
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - kept for the agent's life: run() reads its tail
        # Ray runs an actor's tasks on its main thread, so PR_SET_PDEATHSIG (which follows the
        # thread that forked) fires when the actor's process ends.
        self.process = subprocess.Popen(
            agent_words(address, started_by, order, nproc_per_node, os.getpid()),
            stdin=subprocess.PIPE,
            stdout=self._output,
            stderr=subprocess.STDOUT,
        )
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(secret_hex.encode() + b"\n")
            self.process.stdin.close()
        except OSError:
            pass  # the agent ended already: run() says how

    def run(self) -> tuple[int, str]:
        """Wait for the agent to end; its exit code and the last lines it printed.

        The actor runs one task at a time, so it answers nothing else meanwhile: the kernel learns
        of the node through the agent's link, and ends the actor with ``ray.kill``.
        """
        code = self.process.wait()
        self._output.seek(0)
        data = self._output.read()[-_TAIL_BYTES:]
        lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
        return code, "; ".join(lines[-_TAIL_LINES:])
