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


class ShardedValue:
    """What a rank answers to a plain pull of a value holding DTensors: "gather it, on every rank"."""

    def __repr__(self) -> str:
        return "<sharded: pull gathers it on every rank>"
