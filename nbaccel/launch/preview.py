"""What a launch would do, decided as a launch decides it, with nothing started: ``nbaccel.plan()``.

The same functions decide as in a real launch (``launch.plan.make_plan`` for ranks and devices,
``launch.start_choice`` for the start method and its reason), so a preview and the launch after
it agree. Nothing forks, no port is bound, no notice is printed (they are kept, and shown), and
what the plan would set in this process's environment (Accelerate's RTX 40 guard) is put back.

Example:
    >>> preview = preview_launch(LaunchOptions(num_processes=2, cpu=True))
    >>> preview.backend, [r.device for r in preview.ranks]
    ('gloo', ['cpu', 'cpu'])
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from nbaccel.launch import plan as planning
from nbaccel.launch.notices import kept
from nbaccel.launch.options import LaunchOptions
from nbaccel.launch.preflight import fork_hazards
from nbaccel.launch.seam import LaunchPlan
from nbaccel.launch.start_choice import StartChoice, start_choice
from nbaccel.state.default_group import default_backend
from nbaccel.wire.rank_env import rank_environment, threads_per_rank

FREE_PORT = "<a free port, chosen at launch>"


@dataclass(frozen=True)
class RankPreview:
    """One rank of the preview: its global number, its device, the GPU it gets, its variables."""

    rank: int
    local_rank: int
    device: str  # "cpu", or "cuda:<local index>" as the rank sees it
    gpu: int | None  # the CUDA index as this kernel sees it; None on CPU
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LaunchPreview:
    """What ``notebook_launcher`` with the same arguments would do. ``str()`` reads it out."""

    num_processes: int  # on this node
    device_type: str
    backend: str
    start_method: str  # "fork", "forkserver", "spawn", or "agents" (cluster=)
    start_reason: str
    hazards: tuple[str, ...]  # why forking this kernel is unsafe now (empty: it is safe)
    ranks: tuple[RankPreview, ...]
    device_notes: tuple[str, ...]  # GPUs skipped and why, the torch build
    notices: tuple[str, ...]  # the one-line notices a launch would print
    environment_set: dict[str, str]  # what the plan would set in this process (the ranks inherit it)
    rendezvous: str  # where the ranks meet
    num_nodes: int = 1
    node_rank: int = 0
    one_thread: bool = False
    mixed_precision: str = "no"

    def __str__(self) -> str:
        threads = " (one CPU thread each)" if self.one_thread else ""
        nodes = f", node {self.node_rank} of {self.num_nodes}" if self.num_nodes > 1 else ""
        lines = [
            f"nbaccel plan: {self.num_processes} rank(s) on {self.device_type}{nodes}, backend {self.backend}, mixed precision {self.mixed_precision}",
            f"start: {self.start_method}{threads}: {self.start_reason}",
            f"rendezvous: {self.rendezvous}",
        ]
        lines += [f"  fork hazard: {hazard}" for hazard in self.hazards]
        lines += [f"  rank {r.rank}: {r.device}" + ("" if r.gpu is None else f" (GPU {r.gpu} of this kernel)") for r in self.ranks]
        lines += [f"devices: {note}" for note in self.device_notes]
        lines += [f"a launch would say: nbaccel: {notice}" for notice in self.notices]
        lines += [f"set in this process: {name}={value}" for name, value in self.environment_set.items()]
        lines += _environment_lines(self.ranks)
        lines.append("(nothing was started)")
        return "\n".join(lines)


def _environment_lines(ranks: tuple[RankPreview, ...]) -> list[str]:
    if not ranks:
        return []
    first = ranks[0].environment
    common = {k: v for k, v in first.items() if all(r.environment.get(k) == v for r in ranks)}
    lines = ["environment of every rank:"] + [f"  {k}={v}" for k, v in sorted(common.items())]
    for r in ranks:
        own = {k: v for k, v in r.environment.items() if k not in common}
        if own:
            lines.append(f"environment of rank {r.rank}: " + " ".join(f"{k}={v}" for k, v in sorted(own.items())))
    return lines


def preview_launch(options: LaunchOptions, socket_interface: str | None = None) -> LaunchPreview:
    """The preview of a one-node (or ``num_nodes``) launch with ``options``; raises what the launch
    would raise before starting anything (a bad GPU index, ``start_method='fork'`` in an unsafe kernel).
    ``socket_interface``: gloo's and NCCL's across nodes (None: loopback)."""
    plan, notices, environment_set = _quiet_plan(options)
    choice = start_choice(options.start_method, fork_hazards(), threads_per_rank(plan.num_processes) > 1)
    if choice.said:
        notices.append(choice.reason)
    first_rank, world_size, where = _world(options, plan)
    ranks = tuple(_rank(plan, options, local, first_rank, world_size, socket_interface) for local in range(plan.num_processes))
    return _preview(options, plan, choice, ranks, tuple(notices), environment_set, where)


def preview_cluster(options: LaunchOptions, plan: LaunchPlan, nodes: str) -> LaunchPreview:
    """The preview of a ``cluster=`` launch: ``plan`` is the cluster's, ``nodes`` names its live nodes."""
    choice = StartChoice("agents", f"each node's agent forks its own ranks ({nodes})")
    ranks = tuple(RankPreview(rank, rank, plan.device_type if plan.device_type == "cpu" else "cuda (on its node)", None) for rank in range(plan.num_processes))
    return _preview(options, plan, choice, ranks, (), {}, f"the cluster's store on {plan.master_addr}")


def _preview(
    options: LaunchOptions,
    plan: LaunchPlan,
    choice: StartChoice,
    ranks: tuple[RankPreview, ...],
    notices: tuple[str, ...],
    environment_set: dict[str, str],
    where: str,
) -> LaunchPreview:
    return LaunchPreview(
        num_processes=plan.num_processes,
        device_type=plan.device_type,
        backend=default_backend(plan.device_type),
        start_method=choice.method,
        start_reason=choice.reason.rstrip("."),
        hazards=choice.hazards,
        ranks=ranks,
        device_notes=tuple(plan.device_notes),
        notices=notices,
        environment_set=environment_set,
        rendezvous=where,
        num_nodes=options.num_nodes,
        node_rank=options.node_rank,
        one_thread=choice.one_thread,
        mixed_precision=plan.mixed_precision,
    )


def _quiet_plan(options: LaunchOptions) -> tuple[LaunchPlan, list[str], dict[str, str]]:
    """``make_plan`` with its notices kept and what it set in ``os.environ`` put back (and returned).

    Its device notes are not announced (a launch says each in one line: they lead the notices here)."""
    before = dict(os.environ)
    with kept() as notices:
        try:
            plan = planning.make_plan(options, time.monotonic(), announce=False)
            notices[:0] = plan.device_notes
        finally:
            changed = {k: v for k, v in os.environ.items() if before.get(k) != v}
            for name in changed:
                if name in before:
                    os.environ[name] = before[name]
                else:
                    del os.environ[name]
    return plan, list(notices), changed


def _world(options: LaunchOptions, plan: LaunchPlan) -> tuple[int, int, str]:
    """This node's first global rank, the world's size, and where the ranks meet, in words."""
    if options.num_nodes == 1:
        chosen = FREE_PORT if options.use_port is None else str(options.use_port)
        return 0, plan.num_processes, f"a store in this kernel on {plan.master_addr}:{chosen} (loopback only)"
    host, port = options.rendezvous_endpoint
    how = (
        f"node 0's kernel serves a store bound to {host}:{port} (reachable by anyone who can reach that address while the launch runs)"
        if options.rdzv_backend == "static"
        else f"torch's c10d rendezvous at {host}:{port} (node ranks in order of arrival)"
    )
    guess = f"; global ranks assume {plan.num_processes} rank(s) on every node, and are fixed when the {options.num_nodes} nodes meet"
    return options.node_rank * plan.num_processes, options.num_nodes * plan.num_processes, how + guess


def _rank(plan: LaunchPlan, options: LaunchOptions, local: int, first_rank: int, world_size: int, socket_interface: str | None) -> RankPreview:
    multi = options.num_nodes > 1
    env: dict[str, str] = rank_environment(
        rank=first_rank + local,
        world_size=world_size,
        local_rank=local,
        local_world_size=plan.num_processes,
        node_rank=options.node_rank,
        num_nodes=options.num_nodes,
        master_port=int(options.rendezvous_endpoint[1] if multi else (options.use_port or 0)),
        master_addr=options.rendezvous_endpoint[0] if multi else plan.master_addr,
        device_type=plan.device_type,
        mixed_precision=plan.mixed_precision,
        max_restarts=plan.max_restarts,
        run_id=options.rdzv_id if multi else plan.run_id,
        visible_gpus=plan.gpus,
        socket_interface=socket_interface if multi else None,
    )
    if not multi and options.use_port is None:
        env["MASTER_PORT"] = FREE_PORT
    on_gpu = plan.device_type != "cpu" and plan.gpus is not None
    device = f"{plan.device_type}:{local}" if on_gpu else plan.device_type
    return RankPreview(first_rank + local, local, device, plan.gpus[local] if on_gpu and plan.gpus else None, env)
