"""Sharded models on persistent workers, the kernel's side: pull gathers, push shards, DCP checkpoints.

- ``pull``: a value holding DTensors (FSDP2, tensor parallel, any mesh) is gathered: every rank
  writes its shards in place into one shared memory region the kernel maps (ranks on another node:
  gathered one tensor at a time), and it arrives as plain CPU tensors of the full shapes (``nbaccel.rank.gather``);
  a module arrives as its full state dict, an optimizer as its ``state_dict()``.
- ``push_sharded``: a notebook module goes to the ranks as a skeleton on ``meta`` plus, for each
  rank, only its slice of every parameter (memfds for the big ones), and is ``fully_shard``-ed
  there; or with the user's recipe (``shard=recipe``), every rank maps the full weights and copies
  its own part (``nbaccel.rank.shard_place``).
- ``save`` / ``load``: torch.distributed.checkpoint on every rank, atomic, resharding from N ranks
  to M (``nbaccel.rank.checkpoint``).

Example:
    >>> import torch
    >>> from nbaccel.launch.options import LaunchOptions
    >>> from nbaccel.pool.pool import start_local_workers
    >>> pool = start_local_workers(LaunchOptions(num_processes=2))
    >>> pool.push(model=torch.nn.Linear(4, 2), shard=True)
    >>> {k: tuple(v.shape) for k, v in pool.pull("model").items()}
    {'weight': (2, 4), 'bias': (2,)}
    >>> pool.stop()
"""

from __future__ import annotations

import copy
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from nbaccel.errors import CheckpointError
from nbaccel.wire.rank_calls import RankCode
from nbaccel.wire.sharded import Layout, Refusal, ShardedValue, fill_slots, offsets


class WorkerPool(Protocol):
    """What these functions need of the pool (``nbaccel.pool.pool.WorkerPool``), named here so that
    the two modules do not name each other's types."""

    @property
    def num_processes(self) -> int:
        """How many ranks the pool has."""

    @property
    def shares_memory(self) -> bool:
        """Whether big values may reach the ranks as memfds (ranks on this machine)."""

    def run_task(
        self, task: Callable[[dict[str, Any]], Any], *, ranks: Sequence[int] | None = None, output: str | None = None, label: str = "", remember: bool = True
    ) -> Any:
        """Run ``task`` on ``ranks`` (default all); the answers."""

    def run_each(
        self, tasks: Mapping[int, Callable[[dict[str, Any]], Any]], *, output: str | None = None, label: str = "", remember: bool = True
    ) -> dict[int, Any]:
        """Run each rank's own task; the answers by rank."""


@dataclass
class GatherFetch(RankCode):
    """Every rank gathers ``name``'s DTensors in step; rank ``writer`` answers with the full value."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:gather_fetch"
    name: str
    writer: int


@dataclass
class GatherInto(RankCode):
    """Every rank writes its shards of ``name``'s tensors into ``region`` (mapped shared: the
    kernel's memory); rank ``writer`` answers the rest of the value, with slots for the tensors."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:gather_into"
    name: str
    writer: int
    region: Any  # a SharedRegion in the kernel; on the rank, the uint8 tensor it maps to
    layout: Layout


@dataclass
class PlaceShards(RankCode):
    """One rank's part of a sharded push: the module's skeleton, its slices and the buffers."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:place_shards"
    name: str
    skeleton: Any
    shards: dict[str, Any]
    buffers: dict[str, Any]
    mesh_shape: tuple[int, ...]


@dataclass
class PlaceWith(RankCode):
    """A sharded push with the user's recipe: the skeleton, the recipe, the full parameters (memfds
    every rank maps; each reads only the pages of its own part) and the buffers."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:place_with"
    name: str
    skeleton: Any
    recipe: Callable[[Any, Any], Any]
    params: dict[str, Any]
    buffers: dict[str, Any]
    mesh_shape: tuple[int, ...]


@dataclass
class SaveCheckpoint(RankCode):
    """DCP into ``directory`` on every rank, through the hidden ``partial`` folder (atomic)."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:save_checkpoint"
    directory: str
    names: list[str]
    partial: str


@dataclass
class LoadCheckpoint(RankCode):
    """DCP from ``directory`` on every rank, resharded onto them."""

    code: ClassVar[str] = "nbaccel.rank.worker_calls:load_checkpoint"
    directory: str
    names: list[str]


def pull(pool: WorkerPool, name: str, rank: int) -> Any:
    """``name`` from ``rank``; when it holds DTensors, gathered on every rank and answered by ``rank``."""
    from nbaccel.pool.worker_calls import Fetch

    value = pool.run_task(Fetch(name), ranks=[rank], output="text", label=f"pull {name}", remember=False)[rank]
    if not isinstance(value, ShardedValue):
        return value
    everyone = range(pool.num_processes)
    if not pool.shares_memory:  # ranks on other nodes: gathered one tensor at a time, answered in-band
        return pool.run_task(GatherFetch(name, rank), ranks=everyone, output="text", label=f"pull {name}", remember=False)[rank]
    from nbaccel.wire.shm import SharedRegion

    region = SharedRegion(offsets(value.layout)[1])
    try:
        tree = pool.run_task(GatherInto(name, rank, region, value.layout), ranks=everyone, output="text", label=f"pull {name}", remember=False)[rank]
        return fill_slots(tree, region.tensor(), value.layout)
    finally:
        region.close()  # the mapping keeps the memory as long as the tensors live


def check_mesh(mesh: Sequence[int] | None, world: int) -> tuple[int, ...]:
    """The mesh shape for ``world`` ranks: ``(world,)`` by default, or a 1-D or 2-D shape that fills it.

    >>> check_mesh(None, 4), check_mesh((2, 2), 4)
    ((4,), (2, 2))
    """
    shape = (world,) if mesh is None else tuple(int(size) for size in mesh)
    product = 1
    for size in shape:
        product *= size
    if not 1 <= len(shape) <= 2 or min(shape) < 1 or product != world:
        raise ValueError(
            f"mesh {tuple(shape)!r} does not fit the {world} workers: give one size (the ranks to shard over) or two, replicate x shard "
            f"(HSDP), whose product is {world}, e.g. {(world,)} or {(1, world)}"
        )
    return shape


def shard_tasks(name: str, module: Any, world: int, mesh: Sequence[int] | None = None) -> dict[int, PlaceShards]:
    """For each rank, its ``PlaceShards``: the module on ``meta``, its dim-0 slices, the buffers.

    Slices are cut as FSDP2 cuts them (``torch.chunk`` along dim 0 over the mesh's last dimension;
    ranks past the last chunk get an empty one); the rank checks each against its DTensor's shard.
    """
    import torch

    if not isinstance(module, torch.nn.Module):
        raise TypeError(
            f"cannot push {name!r} with shard=True: a {type(module).__qualname__} is not a torch.nn.Module; push it without --shard (only modules are sharded)"
        )
    shape = check_mesh(mesh, world)
    parts = shape[-1]
    skeleton = _skeleton(module)
    buffers = {fqn: b.detach() for fqn, b in module.named_buffers()}
    tasks = {}
    for rank in range(world):
        index = rank % parts  # the coordinate on the shard dimension (HSDP: replicas share a slice)
        shards = {fqn: _slice(p.detach(), parts, index) for fqn, p in module.named_parameters()}
        tasks[rank] = PlaceShards(name, skeleton, shards, buffers, shape)
    return tasks


def _slice(tensor: Any, parts: int, index: int) -> Any:
    if tensor.dim() == 0:
        raise ValueError("a 0-dimensional parameter cannot be sharded along dim 0 (fully_shard refuses it too)")
    chunks = tensor.chunk(parts, dim=0)
    return chunks[index].contiguous() if index < len(chunks) else tensor[:0].contiguous()


def _skeleton(module: Any) -> Any:
    """A copy of ``module`` whose parameters and buffers are on ``meta``: its structure, no weights."""
    import torch

    memo: dict[int, Any] = {}
    for param in module.parameters():
        memo[id(param)] = torch.nn.Parameter(param.detach().to("meta"), requires_grad=param.requires_grad)
    for buffer in module.buffers():
        memo[id(buffer)] = buffer.detach().to("meta")
    return copy.deepcopy(module, memo)


def push_sharded(pool: WorkerPool, name: str, module: Any, mesh: Sequence[int] | None = None, recipe: Callable[[Any, Any], Any] | None = None) -> None:
    """Place ``module`` on every rank, sharded by ``fully_shard`` (``pool.push(name=module, shard=True)``),
    or by ``recipe(module, mesh)`` on each rank (``shard=recipe``: tensor parallel, per-layer FSDP, ...)."""
    tasks = shard_tasks(name, module, pool.num_processes, mesh)  # checks the module and the mesh either way
    if recipe is None:
        pool.run_each(tasks, output="text", label=f"push {name} --shard", remember=False)
        return
    params = {fqn: p.detach() for fqn, p in module.named_parameters()}
    placed = PlaceWith(name, tasks[0].skeleton, recipe, params, tasks[0].buffers, tasks[0].mesh_shape)
    pool.run_task(placed, output="text", label=f"push {name} --shard {getattr(recipe, '__name__', 'recipe')}", remember=False)


def _check_names(names: Sequence[str], what: str) -> list[str]:
    if not names or not all(isinstance(n, str) and n.isidentifier() for n in names):
        raise ValueError(f"{what} needs the names of variables on the ranks, e.g. {what}('ckpt', 'model', 'optimizer'); got {list(names)!r}")
    return list(names)


def save(pool: WorkerPool, directory: str | os.PathLike[str], names: Sequence[str]) -> str:
    """Save ``names`` with DCP into ``directory`` (atomic); the absolute path."""
    chosen = _check_names(names, "pool.save")
    target = os.path.abspath(os.fspath(directory))
    partial = os.path.join(os.path.dirname(target), f".{os.path.basename(target)}.partial-{uuid.uuid4().hex[:8]}")
    _raise_refusal(pool.run_task(SaveCheckpoint(target, chosen, partial), output="text", label=f"save {target}", remember=False))
    return target


def load(pool: WorkerPool, directory: str | os.PathLike[str], names: Sequence[str]) -> None:
    """Load ``names`` from the DCP checkpoint in ``directory``, resharded onto these ranks."""
    chosen = _check_names(names, "pool.load")
    target = os.path.abspath(os.fspath(directory))
    _raise_refusal(pool.run_task(LoadCheckpoint(target, chosen), output="text", label=f"load {target}", remember=False))


def _raise_refusal(answers: list[Any]) -> None:
    """Every rank answered the same refusal (``nbaccel.wire.sharded.Refusal``): raise it here, once."""
    refusal = next((answer for answer in answers if isinstance(answer, Refusal)), None)
    if refusal is not None:
        raise CheckpointError(refusal.message)
