"""``nbaccel-agent HOST:PORT``: the command each node runs to join a notebook's cluster.

The secret comes from ``--token-stdin`` (one line on standard input: how ``cluster.start_agents``
sends it through ssh or another starting command), ``--token-file`` (a copy of ``cluster.token_file``, or
the file itself on a shared home) or ``$NBACCEL_TOKEN``. An agent given the secret in its
environment starts itself again without it (the token passed on a pipe), so neither the agent's
environment nor ``/proc/PID/environ`` of any rank it forks holds the secret.

Example (on each node; the token file is a copy of the notebook's ``cluster.token_file``)::

    nbaccel-agent 10.0.0.1:29400 --token-file ~/.nbaccel/clusters/cluster.token --nproc-per-node 4
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from nbaccel.agent.node import EXIT_REFUSED, NodeAgent
from nbaccel.agent.ray_actor import die_with_parent
from nbaccel.net.link import split_address
from nbaccel.net.signing import TOKEN_ENV, parse_token, read_token
from nbaccel.rank import process_title


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nbaccel-agent",
        description="Join a notebook's nbaccel cluster and run its launches' ranks on this node.",
    )
    parser.add_argument("address", help="HOST:PORT the notebook's cluster listens on (cluster.address)")
    parser.add_argument("--token-file", help=f"file holding the cluster's secret (default: ${TOKEN_ENV})")
    parser.add_argument("--token-stdin", action="store_true", help="read the cluster's secret from the first line of standard input")
    parser.add_argument("--token-fd", type=int, default=None, help=argparse.SUPPRESS)  # the re-exec's pipe
    parser.add_argument("--nproc-per-node", type=int, default=None, help="ranks on this node (default: one per visible GPU, else 1)")
    parser.add_argument("--order", type=int, default=None, help="this node's place in the node ranks (Slurm's SLURM_NODEID wins); set by start_agents")
    parser.add_argument("--started-by", default="", help="how this agent was started (shown in cluster.nodes); set by start_agents")
    parser.add_argument("--parent-pid", type=int, default=None, help=argparse.SUPPRESS)  # die with it: a Ray actor's agent
    return parser.parse_args(argv)


def _secret(arguments: argparse.Namespace) -> bytes:
    if arguments.token_fd is not None:
        with os.fdopen(arguments.token_fd, encoding="ascii") as pipe:
            return parse_token(pipe.read(), "the agent's token pipe")
    if arguments.token_stdin:
        line = sys.stdin.readline()
        if not line:
            raise ValueError("--token-stdin: standard input ended before the token; send cluster.token_file's contents on stdin")
        return parse_token(line, "standard input")
    return read_token(arguments.token_file)


def _restart_without_token(secret: bytes, argv: Sequence[str]) -> None:
    """Exec this agent again with ``NBACCEL_TOKEN`` removed; the secret travels on a pipe."""
    read_end, write_end = os.pipe()
    os.write(write_end, secret.hex().encode())  # 64 bytes: far below a pipe's buffer
    os.close(write_end)
    os.set_inheritable(read_end, True)
    environment = {name: value for name, value in os.environ.items() if name != TOKEN_ENV}
    os.execve(sys.executable, [sys.executable, "-m", "nbaccel.agent", *argv, "--token-fd", str(read_end)], environment)


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    arguments = parse_arguments(given)
    if arguments.parent_pid is not None:
        die_with_parent(arguments.parent_pid)
    try:
        split_address(arguments.address)
        secret = _secret(arguments)
        if arguments.nproc_per_node is not None and arguments.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node {arguments.nproc_per_node!r} must be at least 1")
    except (ValueError, OSError) as exc:
        print(f"nbaccel-agent: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if TOKEN_ENV in os.environ:
        if argv is not None:  # called in-process (tests): only drop it from this environment
            os.environ.pop(TOKEN_ENV)
        else:
            _restart_without_token(secret, given)
    if argv is None:  # this process is the agent (not a test calling main): ps and top say so
        process_title.name_agent(None, arguments.address)
    agent = NodeAgent(arguments.address, secret, arguments.nproc_per_node, started_by=arguments.started_by, order=arguments.order, name_process=argv is None)
    return agent.run()


if __name__ == "__main__":
    raise SystemExit(main())
