"""Agents started by any command that runs a program on a node and forwards standard input to it.

``via`` is a command template: ``{host}`` is replaced by each host, and the word ``{agent}`` by the
agent's command line (``nbaccel-agent ADDRESS --token-stdin ...``). The secret is written to the
command's standard input, so it is never in an argument or an environment. ssh is this with
``ssh [options] {host} {agent}`` (``nbaccel.cluster.starters.ssh``).

Example (Kubernetes: one pod per node, ``-i`` forwards stdin)::

    cluster.start_agents(via="kubectl exec -i {host} -- {agent}", hosts=["trainer-0", "trainer-1"],
                         agent="/opt/venv/bin/nbaccel-agent")
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from nbaccel.cluster.starters.base import ProcessStart, agent_argv, environment, secret_line

AGENT_WORD, HOST_FIELD = "{agent}", "{host}"


def command_for(template: str | Sequence[str], host: str, agent: list[str]) -> list[str]:
    """The template's words with ``{host}`` filled in and ``{agent}`` replaced by the agent's words.

    Example:
        >>> command_for("kubectl exec -i {host} -- {agent}", "pod-1", ["nbaccel-agent", "10.0.0.1:1"])
        ['kubectl', 'exec', '-i', 'pod-1', '--', 'nbaccel-agent', '10.0.0.1:1']
    """
    words = shlex.split(template) if isinstance(template, str) else list(template)
    if AGENT_WORD not in words:
        raise ValueError(
            f"the command template {template!r} has no {AGENT_WORD} word: put it where the node's command goes, e.g. 'kubectl exec -i {{host}} -- {{agent}}'."
        )
    out: list[str] = []
    for word in words:
        out.extend(agent if word == AGENT_WORD else [word.replace(HOST_FIELD, host)])
    return out


def start_by_template(
    template: str | Sequence[str],
    hosts: Sequence[str],
    address: str,
    token_file: str,
    *,
    agent: str | list[str] | None,
    nproc_per_node: int | None,
    how: str,
    env: dict[str, str] | None = None,
    remote_shell: bool = False,
    first_order: int = 0,
) -> list[ProcessStart]:
    """One starting command's process per host, each handed the secret on its stdin.

    ``remote_shell``: the starting command passes one command line to a shell there (ssh does), so the
    agent's words go as one shell-quoted word. Node ranks follow ``hosts`` (``--order``), after
    the ``first_order`` nodes started earlier.
    """
    line = secret_line(token_file)
    starts: list[ProcessStart] = []
    try:
        for index, host in enumerate(hosts):
            label = f"{how} {host}"
            words = agent_argv(agent, address, label, nproc_per_node, "stdin", first_order + index)
            argv = command_for(template, host, [shlex.join(words)] if remote_shell else words)
            starts.append(ProcessStart(label, argv, stdin_line=line, env=environment(env)))
    except BaseException:
        for start in starts:
            start.process.kill()
            start.stop(3.0)
        raise
    return starts
