"""A ``%%distributed`` cell on running workers: the task each rank runs, and what comes back.

Each rank runs the compiled cell in its own namespace (`nbaccel.notebook.cell.PoolCell`). Only the values
the notebook asked for travel back: the lowest selected rank's value (the cell's result), or
every selected rank's value with ``-o``. On the way, a module comes back as its text (what the
notebook would show, without shipping its weights; ``%distributed pull`` brings them), a shown
value that cannot be pickled comes back as its text too, instead of failing a cell that did run,
and tensors on a GPU arrive on the CPU (``nbaccel.wire.events`` pickles every result that way).

Example:
    >>> import nbaccel
    >>> from nbaccel.notebook.cell import compile_pool_cell
    >>> pool = nbaccel.start_workers(2)
    >>> run_cell(pool, compile_pool_cell("x = 41\\nx + 1"), ranks=None, collect=False)
    (42, None)
    >>> pool.stop()
"""

from __future__ import annotations

import os
import pickle
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nbaccel.launch.options import check_profile
from nbaccel.notebook.cell import PoolCell
from nbaccel.wire import events
from nbaccel.wire.rank_calls import PostMortemOnError

if TYPE_CHECKING:
    from nbaccel.pool import WorkerPool


class RankRepr:
    """A value shown as the text it had on its rank (a module, or what could not be pickled).

    Example:
        >>> RankRepr("Linear(in_features=2, out_features=1, bias=True)")
        Linear(in_features=2, out_features=1, bias=True)
    """

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


class _Shown:
    """Pickles as its value when that pickles (once, on the rank), else as the value's text."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, ...]:
        try:
            return (pickle.loads, (events.dumps(self.value),))
        except Exception:  # noqa: BLE001 - any pickling failure: show it as IPython would
            return (RankRepr, (repr(self.value),))


@dataclass
class CellTask:
    """What each rank runs: the cell in its namespace; its value when ``value_ranks`` asks for it.

    ``value_ranks``: the ranks whose value travels back (the others answer None). ``exact``: with
    ``-o`` a value that cannot be pickled is an error, not its text.
    """

    cell: PoolCell
    value_ranks: tuple[int, ...]
    exact: bool

    def __call__(self, namespace: dict[str, Any]) -> Any:
        value = self.cell(namespace)
        if value is None or int(os.environ.get("RANK", "0")) not in self.value_ranks:
            return None
        value = portable(value)
        return value if self.exact else _Shown(value)


def portable(value: Any) -> Any:
    """``value``, or its text for a module: a model's weights do not travel to be displayed."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.nn.Module):
        return RankRepr(repr(value))
    return value


def run_cell(
    pool: WorkerPool,
    cell: PoolCell,
    ranks: Sequence[int] | None,
    collect: bool,
    timeout: float | None = None,
    output: str | None = None,
    pdb: bool = False,
    profile: bool | str = False,
) -> tuple[Any, list[Any] | dict[int, Any] | None]:
    """Run ``cell`` on ``ranks`` (every rank when None) of ``pool``; ``profile`` as ``--profile``.

    Returns the lowest selected rank's value (the cell's result) and, when ``collect``, every
    selected rank's value: a list by rank, or a dict rank -> value when ``ranks`` were chosen.
    ``pdb``: a rank that raises opens its post-mortem in the cell first (``--pdb``, ``%pdb on``).
    """
    chosen = tuple(range(pool.num_processes)) if ranks is None else tuple(sorted(set(ranks)))
    task: Any = CellTask(cell, chosen if collect else chosen[:1], exact=collect)
    if pdb:
        task = PostMortemOnError(task)
    sink: Any = output
    if profile:
        from nbaccel.output.choose import make_sink
        from nbaccel.output.profile_sink import profiled  # only a profiled cell imports any of it

        task, sink = profiled(task, make_sink(output), check_profile(profile))
    answers = pool.run_task(task, ranks=ranks, timeout=timeout, output=sink, label=_label(cell.source))
    by_rank = dict(enumerate(answers)) if ranks is None else answers
    shown = by_rank[chosen[0]]
    if not collect:
        return shown, None
    return shown, (answers if ranks is None else dict(answers))


def _label(source: str) -> str:
    """The cell's first line of code, as ``%distributed status`` shows it."""
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return first if len(first) <= 60 else first[:57] + "..."
