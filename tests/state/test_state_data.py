"""prepare_data_loader and accumulate in one process, and the sharding arithmetic for any number.

Imports internals (state.data): it tests those units directly, below the public face.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler
from torch.utils.data.distributed import DistributedSampler

from nbaccel import GradientAccumulationPlugin, GradientState, accumulate, prepare_data_loader
from nbaccel.state.data import DataLoaderShard, padding_added, shard_batches

# -- the sharding arithmetic -------------------------------------------------------------------------


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("batch_size", [1, 2, 3])
@pytest.mark.parametrize("length", [0, 1, 2, 5, 7, 12, 13])
def test_shards_cover_the_data_once_plus_padding(length, batch_size, n, drop_last):
    order = list(range(length))
    shards = [shard_batches(order, batch_size, drop_last, n, i) for i in range(n)]
    counts = {len(s) for s in shards}
    assert len(counts) == 1, "every process must run the same number of steps"
    steps = counts.pop()
    seen = []
    for step in range(steps):
        sizes = {len(s[step]) for s in shards}
        assert len(sizes) == 1 and 0 < sizes.pop() <= batch_size
        seen += [i for s in shards for i in s[step]]  # step by step, process by process
    extra = padding_added(length, batch_size, drop_last, n)
    full = (length // (batch_size * n)) * batch_size * n
    assert len(seen) == (full if drop_last else length + extra)
    if not drop_last:
        assert seen[:length] == order and extra < n
        assert seen[length:] == list(itertools.islice(itertools.cycle(order), extra))


def test_global_step_equals_one_big_batch():
    # Process i's s-th batch is the i-th slice of the s-th global batch of n * batch_size samples.
    shards = [shard_batches(range(16), 2, False, 4, i) for i in range(4)]
    assert [shards[i][1] for i in range(4)] == [[8, 9], [10, 11], [12, 13], [14, 15]]


# -- prepare_data_loader in one process -----------------------------------------------------------------


def test_one_process_sees_every_batch_and_the_end_of_the_dataloader():
    loader = prepare_data_loader(DataLoader(list(range(5)), batch_size=2))
    state = GradientState()
    seen = []
    for batch in loader:
        seen.append((batch.tolist(), state.end_of_dataloader, state.remainder, state.active_dataloader is loader))
    assert seen == [([0, 1], False, 0, True), ([2, 3], False, 0, True), ([4], True, 0, True)]
    assert state.active_dataloader is None and state.end_of_dataloader is False and state.remainder == -1
    assert len(loader) == 3 and loader.total_batch_size == 2 and isinstance(loader, DataLoader)


def test_shuffled_loader_yields_a_permutation_each_epoch():
    torch.manual_seed(0)
    loader = prepare_data_loader(DataLoader(list(range(10)), batch_size=3, shuffle=True))
    epochs = [[x for batch in loader for x in batch.tolist()] for _ in range(2)]
    assert all(sorted(e) == list(range(10)) for e in epochs) and epochs[0] != epochs[1]


def test_nested_loaders_restore_the_outer_one_and_break_unregisters():
    outer = prepare_data_loader(DataLoader(list(range(4)), batch_size=2))
    inner = prepare_data_loader(DataLoader(list(range(3)), batch_size=3))
    state = GradientState()
    for _ in outer:
        for _ in inner:
            assert state.active_dataloader is inner and state.end_of_dataloader
        assert state.active_dataloader is outer
        assert state.dataloader_references == [None, outer]
    iterator = iter(outer)
    next(iterator)
    assert state.active_dataloader is outer
    iterator.close()  # what `break` does once the loop's iterator is dropped
    assert state.dataloader_references == [None]


def test_batches_can_be_moved_to_the_device():
    loader = prepare_data_loader(DataLoader([(torch.ones(2), 1)], batch_size=1), put_on_device=True)
    ((features, labels),) = list(loader)
    assert features.device.type in ("cpu", "cuda") and labels.tolist() == [1]


def test_workers_and_collate_fn_are_kept():
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=2, collate_fn=lambda b: sum(b)))
    assert list(loader) == [1, 5]


class Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: DataLoader(Stream(), batch_size=1), "cannot shard an IterableDataset"),
        (lambda: DataLoader(list(range(4)), batch_sampler=[[0, 1], [2, 3]]), "whose batches it cannot cut"),
        (lambda: DataLoader(list(range(4)), batch_size=None), "whose batches it cannot cut"),
        (lambda: DataLoader(list(range(4)), batch_size=2, sampler=DistributedSampler(list(range(4)), num_replicas=2, rank=0)), "shard of a shard"),
        (lambda: prepare_data_loader(DataLoader(list(range(4)), batch_size=2)), "already prepared"),
        (lambda: [1, 2, 3], "takes a torch.utils.data.DataLoader"),
    ],
)
def test_loaders_that_cannot_be_sharded_are_refused(make, message):
    with pytest.raises(TypeError, match=message):
        prepare_data_loader(make())


def test_a_plain_batch_sampler_is_sharded_like_batch_size():
    source = DataLoader(list(range(5)), batch_sampler=BatchSampler(SequentialSampler(range(5)), 2, True))
    assert [b.tolist() for b in prepare_data_loader(source)] == [[0, 1], [2, 3]]


# -- accumulate in one process ---------------------------------------------------------------------


def test_accumulate_synchronises_every_num_steps_and_at_the_end_of_the_dataloader():
    GradientState(GradientAccumulationPlugin(num_steps=3))
    loader = prepare_data_loader(DataLoader(list(range(8)), batch_size=1))
    model = torch.nn.Linear(1, 1)
    syncs = []
    for _ in range(2):  # two epochs: the count starts over after each end of the dataloader
        for _batch in loader:
            with accumulate(model) as sync:
                syncs.append(sync)
                assert GradientState().sync_gradients is sync
    epoch = [False, False, True, False, False, True, False, True]
    assert syncs == epoch + epoch


def test_accumulate_without_sync_with_dataloader_keeps_counting():
    GradientState(GradientAccumulationPlugin(num_steps=3, sync_with_dataloader=False))
    loader = prepare_data_loader(DataLoader(list(range(4)), batch_size=1))
    syncs = []
    for _ in range(2):
        for _batch in loader:
            with accumulate() as sync:
                syncs.append(sync)
    assert syncs == [False, False, True, False, False, True, False, False]


def test_accumulate_enters_no_sync_only_when_not_synchronising():
    entered = []

    class Wrapped(torch.nn.Module):
        def no_sync(self):
            import contextlib

            entered.append(True)
            return contextlib.nullcontext()

    GradientState(GradientAccumulationPlugin(num_steps=2))
    for _ in range(4):
        with accumulate(Wrapped()):
            pass
    assert len(entered) == 2


def test_accumulate_refuses_what_is_not_a_model():
    with pytest.raises(TypeError, match=r"accumulate takes the model\(s\).*got 'model'"), accumulate("model"):
        pass


def test_prepared_loader_is_a_dataloader_shard():
    assert isinstance(prepare_data_loader(DataLoader([1, 2], batch_size=1)), DataLoaderShard)
