"""split_between_processes arithmetic, as pure functions over (input, num_processes, index).

Imports internals (state.split): it tests those units directly, below the public face.
"""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from nbaccel.state.split import padded_length, shard_bounds, split_for_process


def pieces(inputs, n, pad=False):
    return [split_for_process(inputs, n, i, apply_padding=pad) for i in range(n)]


class FakeDataset:
    """The part of datasets.Dataset that splitting uses: len() and select(indices)."""

    def __init__(self, rows):
        self.rows = list(rows)

    def __len__(self):
        return len(self.rows)

    def select(self, indices):
        return FakeDataset(self.rows[i] for i in indices)


# -- the seed's examples and the documented rule ------------------------------------------------


def test_seed_example_two_processes():
    assert pieces(["A", "B", "C"], 2) == [["A", "B"], ["C"]]


def test_seed_example_two_processes_with_padding():
    assert pieces(["A", "B", "C"], 2, pad=True) == [["A", "B"], ["C", "C"]]


def test_uneven_split_gives_first_processes_one_more():
    assert pieces(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]


def test_padding_repeats_the_inputs_last_element_not_the_pieces():
    assert pieces(list(range(7)), 3, pad=True) == [[0, 1, 2], [3, 4, 6], [5, 6, 6]]


def test_shard_bounds_and_padded_length():
    assert [shard_bounds(7, 3, i) for i in range(3)] == [(0, 3), (3, 5), (5, 7)]
    assert [shard_bounds(2, 4, i) for i in range(4)] == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert padded_length(7, 3) == 3 and padded_length(0, 3) == 0 and padded_length(6, 3) == 2


@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("length", range(0, 13))
def test_pieces_concatenate_to_the_input_in_order(length, n):
    data = list(range(length))
    split = pieces(data, n)
    assert list(itertools.chain.from_iterable(split)) == data
    sizes = [len(p) for p in split]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


@pytest.mark.parametrize("n", range(1, 6))
@pytest.mark.parametrize("length", range(0, 13))
def test_padding_makes_every_piece_as_long_as_the_longest(length, n):
    data = list(range(length))
    plain, padded = pieces(data, n), pieces(data, n, pad=True)
    for short, long in zip(plain, padded, strict=True):
        assert len(long) == padded_length(length, n)
        assert long[: len(short)] == short
        assert all(extra == data[-1] for extra in long[len(short) :])


# -- edge cases --------------------------------------------------------------------------------


def test_more_processes_than_items():
    assert pieces(["a", "b"], 4) == [["a"], ["b"], [], []]
    assert pieces(["a", "b"], 4, pad=True) == [["a"], ["b"], ["b"], ["b"]]


@pytest.mark.parametrize("empty", [[], (), torch.empty(0, 3), np.empty((0, 2)), {}])
@pytest.mark.parametrize("pad", [False, True])
def test_empty_input_gives_empty_pieces_without_error(empty, pad):
    for piece in pieces(empty, 3, pad=pad):
        assert len(piece) == 0
        assert type(piece) is type(empty)


def test_tuples_stay_tuples_with_and_without_padding():
    assert pieces(("A", "B", "C"), 2) == [("A", "B"), ("C",)]
    assert pieces(("A", "B", "C"), 2, pad=True) == [("A", "B"), ("C", "C")]


def test_dict_values_are_split_together_and_the_dict_is_not_mutated():
    data = {"a": [1, 2, 3], "b": ("x", "y", "z"), "c": torch.arange(3)}
    before = copy.deepcopy(data)
    split = pieces(data, 2, pad=True)
    assert split[0]["a"] == [1, 2] and split[0]["b"] == ("x", "y") and split[0]["c"].tolist() == [0, 1]
    assert split[1]["a"] == [3, 3] and split[1]["b"] == ("z", "z") and split[1]["c"].tolist() == [2, 2]
    assert data.keys() == before.keys() and data["a"] == before["a"] and data["b"] == before["b"]
    assert torch.equal(data["c"], before["c"])


def test_nested_dicts_are_split_recursively():
    data = {"prompt": ["p0", "p1", "p2"], "meta": {"id": [0, 1, 2]}}
    assert pieces(data, 3)[1] == {"prompt": ["p1"], "meta": {"id": [1]}}


def test_dict_values_of_different_lengths_are_a_clear_error():
    with pytest.raises(ValueError, match=r"same length.*'a': 3, 'b': 2"):
        split_for_process({"a": [1, 2, 3], "b": [1, 2]}, 2, 0)


def test_tensor_is_split_along_the_first_dimension_and_padded_with_its_last_row():
    assert [p.tolist() for p in pieces(torch.arange(5), 3, pad=True)] == [[0, 1], [2, 3], [4, 4]]
    matrix = torch.arange(4).reshape(2, 2)
    assert [p.tolist() for p in pieces(matrix, 3, pad=True)] == [[[0, 1]], [[2, 3]], [[2, 3]]]
    assert [p.tolist() for p in pieces(matrix, 3)] == [[[0, 1]], [[2, 3]], []]


def test_numpy_array_is_split_along_the_first_dimension():
    split = pieces(np.arange(10).reshape(5, 2), 2, pad=True)
    assert [p.tolist() for p in split] == [[[0, 1], [2, 3], [4, 5]], [[6, 7], [8, 9], [8, 9]]]
    assert all(isinstance(p, np.ndarray) for p in split)


def test_dataset_like_objects_are_split_with_select():
    split = pieces(FakeDataset("abcde"), 2, pad=True)
    assert [p.rows for p in split] == [["a", "b", "c"], ["d", "e", "e"]]


@pytest.mark.parametrize("value", ["ABC", b"ABC", {1, 2}, range(3), 42, None, iter([1, 2])])
def test_unsplittable_inputs_are_a_clear_type_error(value):
    with pytest.raises(TypeError, match="cannot split.*handing the whole input to every process"):
        split_for_process(value, 2, 0)


def test_unsplittable_dict_value_names_its_key():
    with pytest.raises(TypeError, match=r"inputs\['text'\]='hello'"):
        split_for_process({"text": "hello"}, 2, 0)


@pytest.mark.parametrize("scalar", [torch.tensor(3.0), np.array(2.0)])
def test_zero_dimensional_arrays_are_a_clear_type_error(scalar):
    with pytest.raises(TypeError, match="0-dimensional"):
        split_for_process(scalar, 2, 0)


def test_one_process_gets_everything():
    assert split_for_process(["A", "B", "C"], 1, 0, apply_padding=True) == ["A", "B", "C"]


@pytest.mark.parametrize(("n", "index"), [(0, 0), (2, 2), (2, -1), (True, 0), (2, 1.0)])
def test_bad_topology_is_rejected(n, index):
    with pytest.raises(ValueError):
        split_for_process([1, 2], n, index)


def test_apply_padding_must_be_a_bool():
    with pytest.raises(TypeError, match="apply_padding must be True or False, got 'yes'"):
        split_for_process([1, 2], 2, 0, apply_padding="yes")
