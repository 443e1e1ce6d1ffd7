"""Agents started over ssh: one session per host, the secret on the session's standard input.

The remote command is the agent's full path (default: the kernel's own environment's
``nbaccel-agent``, the same path on a shared filesystem), because a non-interactive ssh session
does not have a virtual environment on its PATH. ``BatchMode=yes`` keeps ssh from ever asking for
a password or a host key on the kernel's terminal; an ssh that ends before its agent joined
fails ``cluster.wait()`` with its exit code and what it printed.

Example::

    cluster.start_agents(via="ssh", hosts=["node1", "node2"], ssh_config="~/.ssh/config")
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from nbaccel.cluster.starters.base import ProcessStart
from nbaccel.cluster.starters.template import AGENT_WORD, start_by_template


def ssh_template(ssh_options: Sequence[str] = (), ssh_config: str | None = None) -> list[str]:
    """The ssh command template: ``ssh -o BatchMode=yes [-F CONFIG] [OPTIONS] {host} {agent}``.

    Example:
        >>> ssh_template(["-p", "2222"])
        ['ssh', '-o', 'BatchMode=yes', '-p', '2222', '{host}', '{agent}']
    """
    words = ["ssh", "-o", "BatchMode=yes"]
    if ssh_config is not None:
        words += ["-F", os.path.expanduser(ssh_config)]
    return [*words, *ssh_options, "{host}", AGENT_WORD]


def start_by_ssh(
    hosts: Sequence[str],
    address: str,
    token_file: str,
    *,
    agent: str | list[str] | None,
    nproc_per_node: int | None,
    ssh_options: Sequence[str] | str = (),
    ssh_config: str | None = None,
    first_order: int = 0,
) -> list[ProcessStart]:
    """One ssh session per host (the remote shell gets the agent's command line, quoted once)."""
    options = shlex.split(ssh_options) if isinstance(ssh_options, str) else list(ssh_options)
    return start_by_template(
        ssh_template(options, ssh_config),
        hosts,
        address,
        token_file,
        agent=agent,
        nproc_per_node=nproc_per_node,
        how="ssh",
        remote_shell=True,
        first_order=first_order,
    )
