"""Rank side of ``%distributed push NAME --shard``: a module built from its skeleton and this rank's shards.

The kernel sends each rank the module with its parameters on the ``meta`` device (its structure,
no weights), this rank's slice of every parameter, and the (small, unsharded) buffers. The rank
applies ``fully_shard`` on the mesh (1-D over every rank, or ``(replicate, shard)`` for a 2-D
shape: HSDP), allocates its shards (``to_empty``) and copies its slices in: no rank ever holds the
whole model. Also here: what ``%distributed status`` says about the sharded modules of a namespace.

Example (what the task ``nbaccel.pool.sharded.PlaceShards`` runs on each rank, through
``nbaccel.rank.worker_calls.place_shards``)::

    namespace["model"] = place(skeleton, shards, buffers, mesh_shape=(2,))
"""

from __future__ import annotations

import sys
from typing import Any

from nbaccel.rank import gather

_meshes: dict[tuple[int, ...], Any] = {}  # one DeviceMesh per shape for the worker's life: each new one makes process groups


def mesh_of(shape: tuple[int, ...]) -> Any:
    """The worker's DeviceMesh of ``shape`` (made once, by every rank together)."""
    if shape not in _meshes:
        from torch.distributed.device_mesh import init_device_mesh

        from nbaccel.state import PartialState

        names = ("dp",) if len(shape) == 1 else ("dp", "tp")  # a 2-D fully_shard replicates over dp and shards over tp (HSDP)
        _meshes[shape] = init_device_mesh(PartialState().device.type, shape, mesh_dim_names=names)
    return _meshes[shape]


def place(skeleton: Any, shards: dict[str, Any], buffers: dict[str, Any], mesh_shape: tuple[int, ...]) -> Any:
    """``skeleton`` (a module on ``meta``) sharded by ``fully_shard`` on a mesh of ``mesh_shape``,
    its parameters' local shards set from ``shards`` and its buffers from ``buffers``."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from nbaccel.state import PartialState

    fully_shard(skeleton, mesh=mesh_of(mesh_shape))
    skeleton.to_empty(device=PartialState().device)
    with torch.no_grad():
        for fqn, param in skeleton.named_parameters():
            local = param.to_local()
            piece = shards[fqn]
            if tuple(local.shape) != tuple(piece.shape):
                raise ValueError(
                    f"parameter {fqn!r}: fully_shard gave this rank a shard of shape {tuple(local.shape)}, but the kernel cut {tuple(piece.shape)}; "
                    "this torch version shards differently from torch.chunk along dim 0: push the module unsharded and call fully_shard in a cell"
                )
            local.copy_(piece)
        for fqn, buffer in skeleton.named_buffers():
            buffer.copy_(buffers[fqn])
    return skeleton


def shard_sizes(namespace: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """For each module of ``namespace`` holding DTensor parameters: (bytes this rank holds, full size).

    >>> shard_sizes({"x": 1})
    {}
    """
    torch = sys.modules.get("torch")
    tensor_module = sys.modules.get("torch.distributed.tensor")
    if torch is None or tensor_module is None:
        return {}
    sizes: dict[str, tuple[int, int]] = {}
    for name, value in list(namespace.items()):
        if name.startswith("_") or not isinstance(value, torch.nn.Module):
            continue
        params = list(gather.resharded(value).parameters())
        if not any(isinstance(p, tensor_module.DTensor) for p in params):
            continue
        held = sum(p.to_local().nbytes if isinstance(p, tensor_module.DTensor) else p.nbytes for p in params)
        full = sum(p.numel() * p.element_size() for p in params)
        sizes[name] = (held, full)
    return sizes


def place_with(skeleton: Any, recipe: Any, params: dict[str, Any], buffers: dict[str, Any], mesh_shape: tuple[int, ...]) -> Any:
    """``skeleton`` sharded by the user's ``recipe(module, mesh)`` (``parallelize_module``,
    ``fully_shard`` per layer, ...), then each parameter's local part copied from ``params``: the
    full tensors, mapped from the kernel's memfds (only the pages of this rank's part are read)."""
    import torch
    from torch.distributed.tensor import DTensor, distribute_tensor

    from nbaccel.state import PartialState

    recipe(skeleton, mesh_of(mesh_shape))
    skeleton.to_empty(device=PartialState().device)
    with torch.no_grad():
        for fqn, param in skeleton.named_parameters():
            full = params[fqn]
            if isinstance(param, DTensor):
                part = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None).to_local()
                param.to_local().copy_(part)
            else:
                param.copy_(full)
        for fqn, buffer in skeleton.named_buffers():
            buffer.copy_(buffers[fqn])
    return skeleton
