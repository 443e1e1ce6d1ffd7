"""Splitting an input between processes: pure functions over (input, num_processes, index).

``PartialState.split_between_processes`` is a thin context manager over `split_for_process`;
keeping the arithmetic here, free of any process group, lets every edge case be tested in one
process.

The rule: the input is cut into ``num_processes`` contiguous pieces along its first dimension,
in order; when it does not divide evenly the first ``length % num_processes`` processes take one
item more. With ``apply_padding=True`` every piece is then filled up to the longest piece's length
(``ceil(length / num_processes)``) by repeating the input's *last* element. Concatenating the
pieces (padding removed) gives back the input.

Example:
    >>> [split_for_process(["A", "B", "C"], 2, i) for i in range(2)]
    [['A', 'B'], ['C']]
    >>> [split_for_process(["A", "B", "C"], 2, i, apply_padding=True) for i in range(2)]
    [['A', 'B'], ['C', 'C']]
    >>> shard_bounds(7, 3, 2)
    (5, 7)
"""

from __future__ import annotations

import reprlib
import sys
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

_SHORT = reprlib.Repr()
_SHORT.maxstring = 40
_SHORT.maxother = 40


def shard_bounds(length: int, num_processes: int, index: int) -> tuple[int, int]:
    """Start and stop of process ``index``'s contiguous piece of ``length`` items.

    Example:
        >>> [shard_bounds(7, 3, i) for i in range(3)]
        [(0, 3), (3, 5), (5, 7)]
    """
    _check_topology(num_processes, index)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length!r}")
    per_process, extras = divmod(length, num_processes)
    # The first `extras` processes take one item more, so each earlier piece is at most one longer.
    start = index * per_process + min(index, extras)
    return start, start + per_process + (1 if index < extras else 0)


def padded_length(length: int, num_processes: int) -> int:
    """Length of every piece after padding: that of the longest piece, ``ceil(length / n)``.

    Example:
        >>> padded_length(7, 3), padded_length(0, 4), padded_length(2, 4)
        (3, 0, 1)
    """
    return -(-length // num_processes)


def split_for_process(inputs: T, num_processes: int, index: int, apply_padding: bool = False) -> T:
    """Process ``index``'s piece of ``inputs`` (see the module docstring for the rule).

    Supports list, tuple, dict (of any of these, all values of one length; a new dict is returned,
    the caller's is never touched), ``torch.Tensor`` and ``numpy.ndarray`` (split along dim 0) and
    ``datasets.Dataset``-like objects (anything with ``select`` and ``__len__``).

    Raises:
        TypeError: ``inputs`` cannot be split (a str, bytes, a set, a 0-d tensor, ...). Passing
            it whole to every process would silently run the work ``num_processes`` times.
        ValueError: a dict's values have different lengths.
    """
    if not isinstance(apply_padding, bool):
        raise TypeError(f"apply_padding must be True or False, got {apply_padding!r}")
    _check_topology(num_processes, index)
    part: T = _split(inputs, num_processes, index, apply_padding, where="inputs")
    return part


def _split(inputs: Any, num_processes: int, index: int, pad: bool, where: str) -> Any:
    if isinstance(inputs, Mapping):
        _dict_length(inputs, where)  # validate every value before anything is sliced
        return {key: _split(value, num_processes, index, pad, f"{where}[{key!r}]") for key, value in inputs.items()}
    length = _length(inputs, where)
    start, stop = shard_bounds(length, num_processes, index)
    missing = padded_length(length, num_processes) - (stop - start) if pad else 0
    return _slice(inputs, start, stop, missing)


def _slice(inputs: Any, start: int, stop: int, missing: int) -> Any:
    """``inputs[start:stop]`` followed by ``missing`` copies of the input's last element."""
    if isinstance(inputs, (list, tuple)):
        piece: Any = inputs[start:stop]  # a list or tuple here; a tensor or an array below
        # missing > 0 implies a non-empty input: an empty one pads every piece to length 0.
        return piece + type(piece)([inputs[-1]] * missing) if missing else piece
    if _is_tensor(inputs):
        import torch

        piece = inputs[start:stop]
        if missing:
            tail = inputs[-1:].expand(missing, *inputs.shape[1:])
            piece = torch.cat([piece, tail])
        return piece
    if _is_ndarray(inputs):
        import numpy as np

        piece = inputs[start:stop]
        return np.concatenate([piece, np.repeat(inputs[-1:], missing, axis=0)]) if missing else piece
    # datasets.Dataset-like: rows are chosen by index, padding repeats the last row's index.
    last = len(inputs) - 1
    return inputs.select(list(range(start, stop)) + [last] * missing)


def _length(inputs: Any, where: str) -> int:
    """Number of items along the first dimension, or a TypeError saying what cannot be split."""
    if isinstance(inputs, (list, tuple)):
        return len(inputs)
    if _is_tensor(inputs) or _is_ndarray(inputs):
        if inputs.ndim == 0:
            raise TypeError(
                f"split_between_processes cannot split {where}={_SHORT.repr(inputs)}: it is a "
                "0-dimensional array with nothing to split along. Pass an array with at least "
                "one dimension (the first one is split)."
            )
        return int(inputs.shape[0])
    if callable(getattr(inputs, "select", None)) and hasattr(inputs, "__len__"):
        return len(inputs)
    raise TypeError(
        f"split_between_processes cannot split {where}={_SHORT.repr(inputs)} of type "
        f"{type(inputs).__name__}: only list, tuple, dict, torch.Tensor, numpy.ndarray and "
        "datasets.Dataset are split, and handing the whole input to every process would "
        "silently repeat the work on each. Convert it first, e.g. list(...)."
    )


def _dict_length(inputs: Mapping[Any, Any], where: str) -> int:
    """The common length of a dict's values; a ValueError listing them when they differ."""
    lengths = {}
    for key, value in inputs.items():
        inner = f"{where}[{key!r}]"
        lengths[key] = _dict_length(value, inner) if isinstance(value, Mapping) else _length(value, inner)
    if len(set(lengths.values())) > 1:
        raise ValueError(
            f"split_between_processes needs every value of the dict {where} to have the same "
            f"length, so that each process gets matching items, but the lengths are {lengths!r}. "
            "Make the values the same length, or split them one by one."
        )
    return next(iter(lengths.values()), 0)


def _check_topology(num_processes: int, index: int) -> None:
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an int >= 1, got {num_processes!r}")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < num_processes:
        raise ValueError(f"index must be an int in [0, {num_processes}), got {index!r}")


def _is_tensor(value: Any) -> bool:
    # Looked up in sys.modules: a value can only be a tensor if torch is already imported, so
    # splitting plain lists never pays for importing torch (or numpy, below).
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_ndarray(value: Any) -> bool:
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, numpy.ndarray)
