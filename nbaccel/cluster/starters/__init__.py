"""Starting a cluster's node agents from the notebook: ``Cluster.start_agents(via=...)``.

Layering: ``base`` (the handle a cluster watches, and the agent's command line) <- ``template``
(any command that forwards stdin to a program on a node) <- ``ssh``; ``slurm`` (srun in an
allocation, or a submitted job) and ``ray`` (a placement group of agent actors) beside them. This module only picks one by ``via``.

Example::

    cluster = nbaccel.Cluster("10.0.0.1:0")
    cluster.start_agents(via="ssh", hosts=["node1", "node2"])
    cluster.wait(nodes=2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from nbaccel.cluster.starters.base import AgentStart, secret_line
from nbaccel.cluster.starters.slurm import start_by_slurm
from nbaccel.cluster.starters.ssh import start_by_ssh
from nbaccel.cluster.starters.template import AGENT_WORD, start_by_template
from nbaccel.launch.notices import say

__all__ = ["AgentStart", "AgentStartError", "check_starts", "start_with"]


class AgentStartError(RuntimeError):
    """A starting command (ssh, srun, a Slurm job) ended before its agents joined; says its exit code and output."""


def check_starts(starts: Sequence[AgentStart], joined: Sequence[tuple[str, float]], said: dict[int, str]) -> None:
    """While a cluster waits: a start that ended before its agents joined raises; a new queue state is said once.

    ``joined``: ``(started_by, joined_at)`` of every node joined so far (a replacement for a lost
    node has the same label: only nodes that joined after a start count for it); ``said``: what
    was said per start.
    """
    for start in starts:
        if sum(1 for label, at in joined if label == start.label and at >= start.started_at) >= start.expected:
            continue
        failure = start.failure()
        if failure is not None:
            raise AgentStartError(failure)
        progress = start.progress()
        if progress is not None and said.get(id(start)) != progress:
            said[id(start)] = progress
            say(f"waiting for {progress}")


def _need_hosts(via: str, hosts: Sequence[str] | None) -> list[str]:
    if isinstance(hosts, str):
        hosts = hosts.replace(",", " ").split()
    if not hosts:
        raise ValueError(f"via={via!r} starts one agent per host: give hosts=['node1', 'node2'].")
    return list(hosts)


_RAY_OPTIONS = {"nodes", "gpus_per_node", "cpus_per_node", "strategy", "ray_address"}


def _start_by_ray(
    address: str,
    token_file: str,
    hosts: Sequence[str] | None,
    agent: str | list[str] | None,
    nproc_per_node: int | None,
    first_order: int,
    given: dict[str, Any],
) -> AgentStart:
    from nbaccel.cluster.starters.ray import start_by_ray  # Ray is imported only when asked for

    if hosts or agent is not None:
        raise ValueError("via='ray' places agents in a placement group on the Ray cluster's nodes: give nodes=N, not hosts or agent.")
    unknown = set(given) - _RAY_OPTIONS
    if unknown:
        raise TypeError(f"via='ray' takes nodes, gpus_per_node, cpus_per_node, strategy and ray_address, not {', '.join(sorted(unknown))}")
    if "nodes" not in given:
        raise ValueError("via='ray' starts one agent per bundle: say how many nodes (nodes=2).")
    return start_by_ray(address, secret_line(token_file), nproc_per_node=nproc_per_node, first_order=first_order, **given)


def start_with(
    via: str | Sequence[str],
    address: str,
    token_file: str,
    *,
    hosts: Sequence[str] | None = None,
    agent: str | list[str] | None = None,
    nproc_per_node: int | None = None,
    ssh_options: Sequence[str] | str = (),
    ssh_config: str | None = None,
    first_order: int = 0,
    **slurm: Any,
) -> list[AgentStart]:
    """The starts for ``via``: "ssh", "slurm", "ray", or a command template with an ``{agent}`` word.

    ``first_order``: how many agents the cluster started before; hosts' node ranks come after them.
    """
    if via == "ray":
        return [_start_by_ray(address, token_file, hosts, agent, nproc_per_node, first_order, slurm)]
    if via == "ssh":
        return list(
            start_by_ssh(
                _need_hosts("ssh", hosts),
                address,
                token_file,
                agent=agent,
                nproc_per_node=nproc_per_node,
                ssh_options=ssh_options,
                ssh_config=ssh_config,
                first_order=first_order,
            )
        )
    if via == "slurm":
        if hosts:
            raise ValueError("via='slurm' places agents on the job's nodes: give nodes=N, not hosts.")
        unknown = set(slurm) - {"nodes", "gpus_per_node", "time_limit", "partition", "sbatch_options"}
        if unknown & _RAY_OPTIONS:
            raise TypeError(f"{', '.join(sorted(unknown & _RAY_OPTIONS))}: Ray's options, not Slurm's (via='ray').")
        if unknown:
            raise TypeError(f"via='slurm' takes nodes, gpus_per_node, time, partition and sbatch_options, not {', '.join(sorted(unknown))}")
        return [start_by_slurm(address, token_file, agent=agent, nproc_per_node=nproc_per_node, **slurm)]
    if slurm or ssh_options or ssh_config:
        raise TypeError(f"via={via!r}: ssh and Slurm options do not apply to a command template; put them in the template.")
    if isinstance(via, str) and AGENT_WORD not in via:
        raise ValueError(
            f"via={via!r} is neither 'ssh', 'slurm', 'ray' nor a command template with an {AGENT_WORD} word (e.g. 'kubectl exec -i {{host}} -- {{agent}}')."
        )
    how = (via.split() if isinstance(via, str) else list(via))[0]
    return list(
        start_by_template(via, _need_hosts(str(via), hosts), address, token_file, agent=agent, nproc_per_node=nproc_per_node, how=how, first_order=first_order)
    )
