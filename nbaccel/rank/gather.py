"""Gather a sharded value (DTensors: FSDP2, tensor parallel, any mesh) into full CPU tensors, one at a time.

``%distributed pull`` of a model after ``fully_shard`` must give the notebook the full weights,
never a shard nor a ``DeviceMesh`` (which means nothing in a kernel without a process group).
Every rank walks the value in the same order and all-gathers each ``DTensor`` in turn
(``full_tensor()``, a collective on its mesh); the rank that answers (the *writer*) copies each
full tensor into a memfd at once (``nbaccel.wire.shm.Prewritten``) and lets it go, so no rank
holds more than its shards plus one full parameter, and the kernel maps the memfds without a copy.
A module is walked as its ``state_dict()``, an optimizer as its ``state_dict()`` (the same
layout as a plain optimizer's, loadable with ``load_state_dict``).

Example (on the ranks of a pool, after ``fully_shard(model)``)::

    full = gather(namespace["model"], writer=0)   # rank 0: {"0.weight": tensor(...), ...}; others: None
"""

from __future__ import annotations

import os
import sys
from typing import Any

from nbaccel.wire import shm
from nbaccel.wire.sharded import Layout, ShardedValue, Slot, map_tree, offsets, view


def holds_dtensors(value: Any) -> bool:
    """Whether ``value`` (a module, an optimizer, a tensor, or dicts/lists of them) holds a DTensor.

    Asked without importing torch.distributed: a value cannot hold one unless it was imported.

    >>> holds_dtensors({"w": [1, 2.0]})
    False
    """
    tensor_module = sys.modules.get("torch.distributed.tensor")
    if tensor_module is None:
        return False
    dtensor = tensor_module.DTensor
    return any(isinstance(leaf, dtensor) for leaf in _leaves(_as_tree(value)))


def gather(value: Any, writer: int) -> Any:
    """``value`` with every DTensor replaced by its full tensor on the CPU, on rank ``writer``;
    None on the other ranks (which take part in each gather). Every rank must call it, in step."""
    import torch

    mine = int(os.environ.get("RANK", "0")) == writer
    shared = shm.rank_mailbox() is not None  # else the answer travels in-band: plain CPU tensors
    with torch.no_grad():
        full = _gather_tree(_as_tree(value), mine, shared)
    return full if mine else None


def _as_tree(value: Any) -> Any:
    """A module or an optimizer as its state dict; anything else as it is."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.nn.Module):
        return resharded(value).state_dict()
    if torch is not None and isinstance(value, torch.optim.Optimizer):
        return value.state_dict()
    return value


def resharded(module: Any) -> Any:
    """``module`` with its FSDP2 parts back in their shards (a local step, no collective).

    FSDP2 leaves the root's parameters gathered after a forward (the backward would gather them
    again at once); its parameters are then plain tensors of the full shape, not DTensors.
    """
    fsdp = sys.modules.get("torch.distributed.fsdp")
    if fsdp is not None:
        for part in module.modules():
            if isinstance(part, fsdp.FSDPModule):
                part.reshard()
    return module


def _leaves(tree: Any) -> Any:
    if isinstance(tree, dict):
        for item in tree.values():
            yield from _leaves(item)
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _leaves(item)
    else:
        yield tree


def _gather_tree(tree: Any, mine: bool, shared: bool) -> Any:
    """The same walk on every rank: dicts in their order, lists and tuples by index."""
    if isinstance(tree, dict):
        return type(tree)((key, _gather_tree(item, mine, shared)) for key, item in tree.items())
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_gather_tree(item, mine, shared) for item in tree)
    return _gather_leaf(tree, mine, shared)


def _gather_leaf(leaf: Any, mine: bool, shared: bool) -> Any:
    import torch
    from torch.distributed.tensor import DTensor

    if isinstance(leaf, DTensor):
        sharded: Any = leaf.detach()
        full = sharded.full_tensor()  # a collective: every rank, this leaf, now
        return _keep(full.cpu(), shared) if mine else None
    if isinstance(leaf, torch.Tensor):
        return _keep(leaf.detach().cpu(), shared) if mine else None
    return leaf if mine else None


def _keep(tensor: Any, shared: bool) -> Any:
    """A big full tensor goes into a memfd now (and is freed here); a small one stays as it is."""
    import torch

    if shared and tensor.layout == torch.strided and tensor.nbytes >= shm.THRESHOLD:
        return shm.Prewritten(tensor)
    return tensor.clone() if tensor.untyped_storage().nbytes() > tensor.nbytes else tensor  # a view: not its whole storage


def layout_of(value: Any) -> ShardedValue:
    """The shapes and dtypes of ``value``'s tensors (DTensors: their full shapes), in walk order."""
    import torch

    tensors = [leaf for leaf in _leaves(_as_tree(value)) if isinstance(leaf, torch.Tensor)]
    return ShardedValue([(tuple(t.shape), str(t.dtype).removeprefix("torch.")) for t in tensors])


def gather_into(value: Any, writer: int, region: Any, layout: Layout) -> Any:
    """Every rank writes its own shards of ``value``'s tensors at their place in ``region`` (a uint8
    tensor mapped shared with the kernel, ``nbaccel.wire.shm.SharedRegion``): no full tensor on any
    rank, nothing but the layout sent back. Placements other than Shard and Replicate (Partial, the
    strided shards of FSDP over tensor parallel) are gathered (``full_tensor``) and written by the
    writer. Rank ``writer`` answers the tree, with ``Slot`` markers where the tensors are."""
    import torch

    mine = int(os.environ.get("RANK", "0")) == writer
    starts, _ = offsets(layout)
    counter = iter(range(len(layout)))

    def place(leaf: Any) -> Any:
        if not isinstance(leaf, torch.Tensor):
            return leaf if mine else None
        index = next(counter)
        shape, dtype = layout[index]
        _write_part(leaf, view(region, starts[index], shape, dtype), mine)
        return Slot(index) if mine else None

    with torch.no_grad():
        tree = map_tree(_as_tree(value), place)
    return tree if mine else None


def _write_part(leaf: Any, full: Any, mine: bool) -> None:
    from torch.distributed.tensor import DTensor, Replicate, Shard

    if not isinstance(leaf, DTensor):
        if mine:
            full.copy_(leaf.detach())
        return
    sharded: Any = leaf.detach()
    if not all(type(p) in (Shard, Replicate) for p in sharded.placements):
        whole = sharded.full_tensor()  # a collective: every rank, this leaf, now
        if mine:
            full.copy_(whole)
        return
    mesh = sharded.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None or any(type(p) is Replicate and coordinate[dim] != 0 for dim, p in enumerate(sharded.placements)):
        return  # not in this mesh, or a replica: another rank writes this part
    sizes = [(p.dim % sharded.ndim, mesh.size(dim), coordinate[dim]) for dim, p in enumerate(sharded.placements) if type(p) is Shard]
    local_shape, offset = shard_bounds(tuple(sharded.shape), sizes)
    if 0 in local_shape:
        return
    part = full[tuple(slice(start, start + size) for start, size in zip(offset, local_shape, strict=True))]
    part.copy_(sharded.to_local())


def shard_bounds(shape: tuple[int, ...], shards: list[tuple[int, int, int]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The shape and start of one rank's block of a tensor of ``shape`` split by ``shards``, each
    ``(tensor dim, parts, this rank's part)`` in mesh order, split as ``torch.chunk`` (and so DTensor's
    ``Shard``) splits: parts of ``ceil(size / parts)``, the last ones shorter or empty.

    Example:
        >>> shard_bounds((10, 4), [(0, 4, 3)])      # 10 rows in 4 parts of 3: the last holds 1
        ((1, 4), (9, 0))
        >>> shard_bounds((8, 6), [(0, 2, 1), (1, 3, 2)])   # a 2x3 mesh sharding rows, then columns
        ((4, 2), (4, 4))
    """
    local, start = list(shape), [0] * len(shape)
    for dim, parts, part in shards:
        chunk = -(-local[dim] // parts)
        begin = min(chunk * part, local[dim])
        start[dim] += begin
        local[dim] = min(chunk, local[dim] - begin)
    return tuple(local), tuple(start)
