"""Agents started by Ray: a placement group of one bundle per node, one agent actor per bundle.

The kernel must be a Ray driver (``ray.init(address="auto")`` on the Ray head, where JupyterLab
runs in a KubeRay RayCluster; or ``ray_address=`` here). ``start_by_ray`` reserves a placement
group of ``nodes`` bundles ``{"CPU": C, "GPU": G}`` (``STRICT_SPREAD``: one bundle per Ray node;
``PACK`` and ``SPREAD`` allowed), and places in each bundle an actor
(``nbaccel.agent.ray_actor.RayNodeAgent``, ``num_gpus=G``) that runs the ordinary node agent, which
dials this cluster over the signed link as an agent started by ssh or Slurm does. The GPUs Ray
assigns to the bundle (the actor's ``CUDA_VISIBLE_DEVICES``) are the node's GPUs.

The secret travels as the actor's argument, over Ray (the actor hands it to its agent on stdin):
whoever can read Ray's control store or run code in the Ray cluster can read it, and they can run
code on its nodes anyway (docs/multinode.md says what each way trusts).

Lifecycle: ``stop()`` (``cluster.close()``) kills the actors and removes the placement group. The
actors and the group belong to the kernel's Ray job, so the kernel's death ends them too. A Ray
node lost takes its actor, its agent and the agent's ranks down (each dies with its parent), and
the cluster sees the agent's connection close. Ray restarts that actor where the group's bundle is
rescheduled (a new node): its agent joins again under the same label.

Example::

    ray.init(address="auto")
    cluster = nbaccel.Cluster(f"{ray.util.get_node_ip_address()}:0")
    cluster.start_agents(via="ray", nodes=2, gpus_per_node=8, cpus_per_node=16)
    cluster.wait(nodes=2)
"""

from __future__ import annotations

import time
from typing import Any

from nbaccel.cluster.starters.base import AgentStart

STRATEGIES = ("STRICT_SPREAD", "PACK", "SPREAD", "STRICT_PACK")
_LOOK_EVERY = 0.5  # seconds between looks at the placement group while the cluster waits
_INSTALL = 'pip install "nbaccel[ray]" (the same Ray version on every node of the Ray cluster)'


def import_ray() -> Any:
    """Ray, imported now (never at nbaccel's import); a clear error naming the extra without it."""
    try:
        import ray
    except ImportError:
        raise ImportError(f'via="ray" needs Ray in the kernel\'s environment, which has none: {_INSTALL}.') from None
    return ray


def attach(ray: Any, address: str | None) -> None:
    """Make this kernel a driver of a Ray cluster: the one it is attached to, else ``address`` (default "auto")."""
    if ray.is_initialized():
        return
    try:
        ray.init(address=address or "auto", log_to_driver=False)
    except ConnectionError as exc:
        raise ConnectionError(
            f'via="ray" found no Ray cluster to attach to at {address or "auto"!r} ({exc}). Run the notebook on the Ray head '
            'and call ray.init(address="auto") first (or pass ray_address="HOST:6379"); `ray status` there shows the cluster.'
        ) from None


def bundles(nodes: int, gpus_per_node: int, cpus_per_node: float) -> list[dict[str, float]]:
    """One bundle per node: what each agent's actor reserves.

    Example:
        >>> bundles(2, 4, 8)
        [{'CPU': 8, 'GPU': 4}, {'CPU': 8, 'GPU': 4}]
        >>> bundles(1, 0, 1)
        [{'CPU': 1}]
    """
    if not isinstance(nodes, int) or nodes < 1:
        raise ValueError(f"nodes={nodes!r}: give how many Ray nodes run an agent (at least 1).")
    if gpus_per_node < 0 or cpus_per_node <= 0:
        raise ValueError(f"gpus_per_node={gpus_per_node!r}, cpus_per_node={cpus_per_node!r}: GPUs at least 0, CPUs more than 0 per node.")
    bundle: dict[str, float] = {"CPU": cpus_per_node, **({"GPU": gpus_per_node} if gpus_per_node else {})}
    return [dict(bundle) for _ in range(nodes)]


class RayStart(AgentStart):
    """A placement group and its agent actors; ``failure()`` is an agent (or actor) that ended before joining."""

    def __init__(self, ray: Any, group: Any, actors: list[Any], runs: list[Any], label: str, wanted: list[dict[str, float]], strategy: str) -> None:
        self.ray, self.group, self.actors, self.runs = ray, group, actors, runs
        self.label, self.expected, self.started_at = label, len(actors), time.monotonic()
        self._wanted, self._strategy = wanted, strategy
        self._checked, self._state = 0.0, "PENDING"

    def _group_state(self) -> str:
        now = time.monotonic()
        if now - self._checked >= _LOOK_EVERY:
            self._checked = now
            from ray.util import placement_group_table

            self._state = str(placement_group_table(self.group).get("state", "?"))
        return self._state

    def progress(self) -> str | None:
        state = self._group_state()
        if state == "CREATED":
            return f"{self.label}: placed, agents starting"
        have = {name: value for name, value in self.ray.available_resources().items() if name in ("CPU", "GPU")}
        alive = sum(1 for node in self.ray.nodes() if node.get("Alive"))
        return f"{self.label}: {state} ({len(self._wanted)} x {self._wanted[0]}, {self._strategy}; the Ray cluster has {have} free on {alive} node(s))"

    def failure(self) -> str | None:
        done, _ = self.ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for run in done:
            index = self.runs.index(run)
            try:
                code, tail = self.ray.get(run)
            except Exception as exc:  # noqa: BLE001 - the actor died (its node, ray.kill): Ray's words say how
                return f"{self.label}: the agent actor of bundle {index} died before its agent joined: {type(exc).__name__}: {str(exc).strip()[:400]}"
            return f"{self.label}: the agent of bundle {index} ended with exit code {code} before it joined" + (
                f": {tail}" if tail else " (it printed nothing)"
            )
        return None

    def stop(self, grace: float) -> None:
        """The agents were told to exit: give them ``grace`` seconds, then kill the actors and remove the group."""
        try:
            self.ray.wait(self.runs, num_returns=len(self.runs), timeout=grace)
        except Exception:  # noqa: BLE001 - Ray itself going away: the kills below still try
            pass
        for actor in self.actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead or Ray gone: nothing to end
                pass
        from ray.util import remove_placement_group

        try:
            remove_placement_group(self.group)
        except Exception:  # noqa: BLE001 - removed already (the job ended)
            pass

    def __repr__(self) -> str:
        return f"<RayStart {self.label}: {self.expected} agent actor(s), group {self._group_state()}>"


def start_by_ray(
    address: str,
    secret_hex: str,
    *,
    nodes: int,
    gpus_per_node: int = 0,
    cpus_per_node: float = 1,
    strategy: str = "STRICT_SPREAD",
    nproc_per_node: int | None = None,
    ray_address: str | None = None,
    first_order: int = 0,
) -> RayStart:
    """Reserve the bundles and place an agent actor in each; node ranks follow the bundles' order."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: one of {', '.join(STRATEGIES)} (STRICT_SPREAD puts one agent on each Ray node).")
    wanted = bundles(nodes, gpus_per_node, cpus_per_node)
    ray = import_ray()
    attach(ray, ray_address)
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from nbaccel.agent.ray_actor import RayNodeAgent  # the node side's actor class, named for Ray: see the module

    group = placement_group(wanted, strategy=strategy)
    label = f"ray placement group {group.id.hex()[:8]}"
    # max_restarts: an actor whose node died comes back where Ray reschedules its bundle.
    actor_class = ray.remote(max_restarts=-1, max_task_retries=0)(RayNodeAgent)
    actors, runs = [], []
    for index in range(nodes):
        placed = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
        actor = actor_class.options(num_cpus=cpus_per_node, num_gpus=gpus_per_node, scheduling_strategy=placed).remote(
            address, secret_hex, nproc_per_node, label, first_order + index
        )
        actors.append(actor)
        runs.append(actor.run.remote())
    return RayStart(ray, group, actors, runs, label, wanted, strategy)
