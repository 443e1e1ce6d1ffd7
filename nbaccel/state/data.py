"""Data-parallel training helpers that keep ``GradientState`` true: sharded DataLoaders and ``accumulate``.

Example (on every rank; each sees its own quarter of the data on 4 ranks)::

    loader = nbaccel.prepare_data_loader(DataLoader(dataset, batch_size=8, shuffle=True))
    model = DDP(model)
    nbaccel.GradientState(nbaccel.GradientAccumulationPlugin(num_steps=4))
    for x, y in loader:
        with nbaccel.accumulate(model):
            (loss_fn(model(x), y) / 4).backward()  # all-reduce on every 4th batch only
        if nbaccel.GradientState().sync_gradients:
            optimizer.step()
            optimizer.zero_grad()
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from nbaccel.state.gradient import GradientState
from nbaccel.state.partial import PartialState

__all__ = ["DataLoaderShard", "accumulate", "padding_added", "prepare_data_loader", "shard_batches"]


def shard_batches(order: Sequence[int], batch_size: int, drop_last: bool, num_processes: int, index: int) -> list[list[int]]:
    """Process ``index``'s batches of sample indices, given the epoch's global ``order``.

    Step ``s`` takes the ``s``-th ``batch_size * num_processes`` samples of ``order``; process
    ``i`` gets the ``i``-th ``batch_size`` of them, so the processes together see exactly what
    one process with a ``num_processes`` times larger batch would. A short last step is padded
    (with samples from the start of ``order``) to a multiple of ``num_processes`` and shared out
    evenly, so every process runs the same number of steps; ``drop_last`` drops it instead.

    Example:
        >>> [shard_batches(range(10), 2, False, 4, i) for i in range(4)]
        [[[0, 1], [8]], [[2, 3], [9]], [[4, 5], [0]], [[6, 7], [1]]]
    """
    step = batch_size * num_processes
    full_steps, tail = divmod(len(order), step)
    batches = [list(order[s * step + index * batch_size : s * step + (index + 1) * batch_size]) for s in range(full_steps)]
    if tail and not drop_last:
        extra = padding_added(len(order), batch_size, drop_last, num_processes)
        padded = list(order[full_steps * step :]) + list(itertools.islice(itertools.cycle(order), extra))
        share = len(padded) // num_processes
        batches.append(padded[index * share : (index + 1) * share])
    return batches


def padding_added(length: int, batch_size: int, drop_last: bool, num_processes: int) -> int:
    """How many duplicate samples `shard_batches` adds to the last step (``GradientState.remainder``).

    Example:
        >>> padding_added(10, 2, False, 4), padding_added(8, 2, False, 4), padding_added(10, 2, True, 4)
        (2, 0, 0)
    """
    tail = length % (batch_size * num_processes)
    return 0 if drop_last or tail == 0 else -tail % num_processes


class _ShardBatchSampler(Sampler[list[int]]):
    """Yields this process's batches of the order its DataLoaderShard set for the epoch."""

    def __init__(self, length: int, batch_size: int, drop_last: bool, num_processes: int, index: int) -> None:
        self.length, self.batch_size, self.drop_last = length, batch_size, drop_last
        self.num_processes, self.index = num_processes, index
        self.order: Sequence[int] = range(length)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(shard_batches(self.order, self.batch_size, self.drop_last, self.num_processes, self.index))

    def __len__(self) -> int:
        full_steps, tail = divmod(self.length, self.batch_size * self.num_processes)
        return full_steps + (1 if tail and not self.drop_last else 0)


class DataLoaderShard(DataLoader[Any]):
    """A DataLoader over this process's shard, which keeps ``GradientState`` up to date.

    Made by `prepare_data_loader`. While it is iterated it is ``GradientState().active_dataloader``;
    ``end_of_dataloader`` turns True as its last batch is yielded, and ``remainder`` is the number
    of duplicate samples padding added to the last step (0 when none).
    """

    def __init__(self, source: DataLoader[Any], num_processes: int, index: int, put_on_device: bool) -> None:
        batching: BatchSampler = source.batch_sampler  # type: ignore[assignment]  # checked by _check_shardable
        self._source_sampler = batching.sampler
        length = len(batching.sampler)  # type: ignore[arg-type]
        self._batch_sampler = _ShardBatchSampler(length, batching.batch_size, batching.drop_last, num_processes, index)
        workers = source.num_workers
        super().__init__(
            source.dataset,
            batch_sampler=self._batch_sampler,
            num_workers=workers,
            collate_fn=source.collate_fn,
            pin_memory=source.pin_memory,
            timeout=source.timeout,
            worker_init_fn=source.worker_init_fn,
            multiprocessing_context=source.multiprocessing_context,
            generator=source.generator,
            prefetch_factor=source.prefetch_factor if workers > 0 else None,
            persistent_workers=source.persistent_workers if workers > 0 else False,
            pin_memory_device=source.pin_memory_device,
        )
        self.total_batch_size = batching.batch_size * num_processes
        self.remainder = padding_added(length, batching.batch_size, batching.drop_last, num_processes)
        self.end_of_dataloader = False
        self._put_on_device = put_on_device

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        self._batch_sampler.order = self._epoch_order()
        self.end_of_dataloader = False
        gradient_state = GradientState()
        gradient_state._add_dataloader(self)
        try:
            # One batch of look-ahead: the last batch is known only when the next one is missing.
            batches = super().__iter__()
            current = next(batches, _END)
            if current is _END:
                return
            for upcoming in batches:
                yield self._place(current)
                current = upcoming
            self.end_of_dataloader = True
            yield self._place(current)
        finally:
            gradient_state._remove_dataloader(self)

    def _epoch_order(self) -> Sequence[int]:
        """This epoch's sample order, the same on every process: the main process's sampler decides."""
        sampler, state = self._source_sampler, PartialState()
        if isinstance(sampler, SequentialSampler):
            return range(len(sampler))
        length = len(sampler)  # type: ignore[arg-type]
        order = torch.tensor(list(sampler) if state.is_main_process else [0] * length, dtype=torch.int64)
        if len(order) != length:
            raise RuntimeError(f"the DataLoader's sampler yielded {len(order)} indices but its len() is {length}.")
        if state.use_distributed:
            # Samplers that shuffle draw from each process's own RNG; one broadcast makes every
            # process cut the same permutation, so the shards never overlap.
            on_device = order.to(state.device)
            dist.broadcast(on_device, src=0)
            order = on_device.cpu()
        return order.tolist()

    def _place(self, batch: Any) -> Any:
        return _to_device(batch, PartialState().device) if self._put_on_device else batch


_END = object()


def prepare_data_loader(dataloader: DataLoader[Any], *, put_on_device: bool = False) -> DataLoaderShard:
    """Shard a DataLoader across the processes; each gets its own ``batch_size`` per step.

    All processes together see every sample once per epoch (plus up to ``num_processes - 1``
    duplicates padding the last step, counted in ``GradientState().remainder``), in the order of
    the main process's sampler, and run the same number of steps. Call it on every process.

    Args:
        dataloader: a DataLoader over a map-style dataset with a ``batch_size`` (or a plain
            ``BatchSampler``).
        put_on_device: move every batch to ``PartialState().device``.

    Raises:
        TypeError: an IterableDataset, a custom ``batch_sampler`` or a DistributedSampler (which
            would shard twice).

    Example:
        >>> loader = prepare_data_loader(DataLoader(list(range(6)), batch_size=2))
        >>> [batch.tolist() for batch in loader]  # one process: everything
        [[0, 1], [2, 3], [4, 5]]
    """
    _check_shardable(dataloader)
    state = PartialState()
    return DataLoaderShard(dataloader, state.num_processes, state.process_index, put_on_device)


def _check_shardable(dataloader: Any) -> None:
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader takes a torch.utils.data.DataLoader, got {dataloader!r}.")
    if isinstance(dataloader, DataLoaderShard):
        raise TypeError("this DataLoader was already prepared by prepare_data_loader; use it as it is.")
    if isinstance(dataloader.dataset, IterableDataset):
        raise TypeError(
            "prepare_data_loader cannot shard an IterableDataset: it has no indices to split. "
            "Shard inside the dataset's __iter__ with PartialState().process_index instead."
        )
    if type(dataloader.batch_sampler) is not BatchSampler:
        raise TypeError(
            f"prepare_data_loader needs a DataLoader built with batch_size=... (or a plain "
            f"BatchSampler), but this one has the batch_sampler {dataloader.batch_sampler!r}, whose "
            "batches it cannot cut into shards. Use batch_size (and sampler=...)."
        )
    if isinstance(dataloader.batch_sampler.sampler, DistributedSampler):
        raise TypeError(
            "this DataLoader already uses a DistributedSampler, so each process would get a shard "
            "of a shard. Build it with a plain sampler (or shuffle=True) and let "
            "prepare_data_loader shard it, or use it as it is without prepare_data_loader."
        )


def _to_device(batch: Any, device: torch.device) -> Any:
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return type(batch)({k: _to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, (list, tuple)):
        moved = [_to_device(v, device) for v in batch]
        return type(batch)(*moved) if hasattr(batch, "_fields") else type(batch)(moved)
    return batch


@contextmanager
def accumulate(*models: torch.nn.Module) -> Iterator[bool]:
    """One micro-batch of gradient accumulation: gradients are all-reduced every ``num_steps`` calls.

    Counts the micro-batch in ``GradientState`` (``num_steps`` from its plugin), sets
    ``sync_gradients``, and, on the micro-batches that do not synchronise, enters each model's
    ``no_sync()`` (DDP, FSDP) so backward skips the all-reduce. The last batch of a prepared
    DataLoader always synchronises when ``sync_with_dataloader``. Yields ``sync_gradients``.

    Scale the loss by ``1 / num_steps`` yourself, and step the optimizer only when
    ``sync_gradients`` is True: then k micro-batches give the gradients of one k-times larger batch.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> with accumulate(model) as syncing:
        ...     model(torch.ones(1, 2)).sum().backward()
        >>> syncing  # num_steps=1: every micro-batch synchronises
        True
    """
    for model in models:
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"accumulate takes the model(s) being trained (torch.nn.Module), got {model!r}.")
    sync = GradientState()._count_micro_batch()
    with ExitStack() as stack:
        if not sync:
            for model in models:
                no_sync = getattr(model, "no_sync", None)
                if callable(no_sync):  # a plain module has nothing to skip
                    stack.enter_context(no_sync())
        yield sync
