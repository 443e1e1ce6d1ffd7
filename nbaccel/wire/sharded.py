"""What a sharded value's worker calls answer across the fork: a pull's layout and slots, a checkpoint's refusal.

A pull of a value holding DTensors goes in two steps (``nbaccel.pool.sharded``): the rank first
answers a ``ShardedValue`` (the shapes and dtypes of its tensors, in walk order); the kernel maps
one shared region of ``offsets(layout)`` bytes, every rank writes its shards into it
(``nbaccel.rank.gather``), and the writer answers the value's tree with a ``Slot`` for each
tensor, which ``fill_slots`` turns into views of the region. A DCP save or load that every rank
refused answers a ``Refusal`` (``nbaccel.rank.checkpoint``), which the kernel raises once.
Both sides take these from here.

Example:
    >>> offsets([((2, 3), "float32"), ((5,), "int64")])
    ([0, 64], 104)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Layout = list[tuple[tuple[int, ...], str]]  # each tensor's (shape, dtype name), in walk order


class ShardedValue:
    """What a rank answers to a plain pull of a value holding DTensors: "gather it, on every rank",
    with the layout of its tensors in walk order (``(shape, dtype name)``), for a region to write into."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    def __repr__(self) -> str:
        return "<sharded: pull gathers it on every rank>"


class Slot:
    """The place of a tensor in the region, in a gathered tree (the kernel puts the tensor there)."""

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass(frozen=True)
class Refusal:
    """What every rank answers when the save or load was refused: the kernel raises ``CheckpointError``.

    Answered, not raised: a rank that raises has its peers interrupted, and a peer still inside
    the collective that shared the refusal would leave it half done (the group out of step).
    """

    message: str


def offsets(layout: Layout) -> tuple[list[int], int]:
    """Where each tensor of ``layout`` starts in one region (64-byte aligned), and the region's size.

    >>> offsets([((2, 3), "float32"), ((5,), "int64")])
    ([0, 64], 104)
    """
    import torch

    starts, end = [], 0
    for shape, dtype in layout:
        end = -(-end // 64) * 64
        starts.append(end)
        end += torch.Size(shape).numel() * torch.empty(0, dtype=getattr(torch, dtype)).element_size()
    return starts, end


def map_tree(tree: Any, leaf_function: Callable[[Any], Any]) -> Any:
    """``tree`` (dicts, lists, tuples; named tuples are leaves) with each leaf mapped, in walk order.

    >>> map_tree({"a": [1, 2], "b": (3,)}, lambda leaf: leaf * 10)
    {'a': [10, 20], 'b': (30,)}
    """
    if isinstance(tree, dict):
        return type(tree)((key, map_tree(item, leaf_function)) for key, item in tree.items())
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(map_tree(item, leaf_function) for item in tree)
    return leaf_function(tree)


def fill_slots(tree: Any, region: Any, layout: Layout) -> Any:
    """The kernel's side: ``tree`` with each ``Slot`` replaced by its tensor, a view of ``region``."""
    starts, _ = offsets(layout)

    def fill(leaf: Any) -> Any:
        if not isinstance(leaf, Slot):
            return leaf
        shape, dtype = layout[leaf.index]
        return view(region, starts[leaf.index], shape, dtype)

    return map_tree(tree, fill)


def view(region: Any, start: int, shape: tuple[int, ...], dtype: str) -> Any:
    """The tensor of ``shape`` and ``dtype`` at byte ``start`` of ``region`` (a view: no copy)."""
    import torch

    kind = getattr(torch, dtype)
    nbytes = torch.Size(shape).numel() * torch.empty(0, dtype=kind).element_size()
    return region[start : start + nbytes].view(kind).view(shape)
