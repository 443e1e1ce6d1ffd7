"""``nbaccel-agent HOST:PORT``: the command each node runs to join a notebook's cluster.

Example (on each node; the token file is a copy of the notebook's ``cluster.token_file``)::

    nbaccel-agent 10.0.0.1:29400 --token-file ~/.nbaccel/cluster.token --nproc-per-node 4
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from nbaccel.agent.node import EXIT_REFUSED, NodeAgent, split_address
from nbaccel.agent.signing import TOKEN_ENV, read_token


def parse_arguments(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="nbaccel-agent",
        description="Join a notebook's nbaccel cluster and run its launches' ranks on this node.",
    )
    parser.add_argument("address", help="HOST:PORT the notebook's cluster listens on (cluster.address)")
    parser.add_argument("--token-file", help=f"file holding the cluster's secret (default: ${TOKEN_ENV})")
    parser.add_argument("--nproc-per-node", type=int, default=None, help="ranks on this node (default: one per visible GPU, else 1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = parse_arguments(argv)
    try:
        split_address(arguments.address)
        secret = read_token(arguments.token_file)
        if arguments.nproc_per_node is not None and arguments.nproc_per_node < 1:
            raise ValueError(f"--nproc-per-node {arguments.nproc_per_node!r} must be at least 1")
    except (ValueError, OSError) as exc:
        print(f"nbaccel-agent: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return NodeAgent(arguments.address, secret, arguments.nproc_per_node).run()


if __name__ == "__main__":
    raise SystemExit(main())
