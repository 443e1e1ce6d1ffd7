"""Process control: who runs what, and when. Everything that follows from a process's place in the launch.

`ProcessControl` holds the helpers ``PartialState`` offers to code running on every process
(``is_main_process``, ``wait_for_everyone``, ``main_process_first``, the ``on_*`` decorators,
``print``, ``split_between_processes``); a subclass supplies the four facts they need:
``num_processes``, ``process_index``, ``local_process_index`` and ``device``.

Example:
    >>> from nbaccel import PartialState
    >>> state = PartialState()
    >>> @state.on_main_process
    ... def report():
    ...     return "only on process 0"
    >>> report()
    'only on process 0'
"""

from __future__ import annotations

import abc
import builtins
import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from nbaccel.errors import NbaccelError
from nbaccel.state import default_group as process_group
from nbaccel.state.split import split_for_process

T = TypeVar("T")
R = TypeVar("R")


class FirstProcessFailedError(NbaccelError, RuntimeError):
    """Raised on the waiting processes when the process that went first raised inside the block."""


class ProcessControl(abc.ABC):
    """Helpers that decide which process runs what; subclasses say where this process stands."""

    @property
    @abc.abstractmethod
    def num_processes(self) -> int:
        """How many processes run in parallel."""

    @property
    @abc.abstractmethod
    def process_index(self) -> int:
        """This process's global index."""

    @property
    @abc.abstractmethod
    def local_process_index(self) -> int:
        """This process's index on its machine."""

    @property
    @abc.abstractmethod
    def device(self) -> torch.device:
        """The device this process uses (collectives run on it)."""

    @property
    def use_distributed(self) -> bool:
        """Whether there is more than one process."""
        return self.num_processes > 1

    @property
    def is_main_process(self) -> bool:
        """Whether this is process 0 of the whole launch."""
        return self.process_index == 0

    @property
    def is_local_main_process(self) -> bool:
        """Whether this is process 0 of its machine."""
        return self.local_process_index == 0

    @property
    def is_last_process(self) -> bool:
        """Whether this is the process with the highest index."""
        return self.process_index == self.num_processes - 1

    def wait_for_everyone(self) -> None:
        """Block until every process reaches this call; does nothing for one process.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> state.wait_for_everyone()  # e.g. before saving what every process trained
        """
        if self.use_distributed:
            process_group.barrier(self.device)

    @contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Run the ``with`` block on the main process first, then on all the others.

        Exception-safe: if the main process raises inside the block, the others are released
        and raise ``FirstProcessFailedError`` instead of running the block (or waiting forever).

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> with state.main_process_first():
            ...     print(f"This will be printed by process {state.process_index}")
            This will be printed by process 0
        """
        with self._goes_first(self.is_main_process, "main_process_first", "the main process"):
            yield

    @contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Run the ``with`` block on each machine's local main process first, then on the others.

        Exception-safe like `main_process_first`.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> with state.local_main_process_first():
            ...     print(f"This will be printed by process {state.local_process_index}")
            This will be printed by process 0
        """
        with self._goes_first(self.is_local_main_process, "local_main_process_first", "a local main process"):
            yield

    @contextmanager
    def _goes_first(self, leads: bool, name: str, leader: str) -> Iterator[None]:
        if not self.use_distributed:
            yield
            return
        # One collective per process: the leaders after their block, the others before theirs.
        # It carries whether a leader failed, so a failure releases the others with an error
        # instead of leaving them at a barrier the leader never reaches.
        if not leads:
            if process_group.any_process_flagged(False, self.device):
                raise FirstProcessFailedError(
                    f"{leader} raised an exception inside {name}(), so process {self.process_index} "
                    "does not run the block: it was meant to run there first (e.g. to download or "
                    "prepare data). Fix the error shown in that process's output."
                )
            yield
            return
        failed = True
        try:
            yield
            failed = False
        finally:
            process_group.any_process_flagged(failed, self.device)

    def on_main_process(self, function: Callable[..., R] | None = None) -> Any:
        """Decorator: run the function on the main process only; elsewhere it returns None.

        Usable bare or called: ``@state.on_main_process`` and ``@state.on_main_process()``.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> @state.on_main_process
            ... def print_something():
            ...     print("This will be printed by process 0 only.")
            >>> print_something()
            This will be printed by process 0 only.
        """
        return self._gate(function, "on_main_process", lambda: self.is_main_process)

    def on_local_main_process(self, function: Callable[..., R] | None = None) -> Any:
        """Decorator: run the function on each machine's local main process only.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> @state.on_local_main_process
            ... def print_something():
            ...     print("This will be printed by process 0 only on each server.")
            >>> print_something()
            This will be printed by process 0 only on each server.
        """
        return self._gate(function, "on_local_main_process", lambda: self.is_local_main_process)

    def on_last_process(self, function: Callable[..., R] | None = None) -> Any:
        """Decorator: run the function on the last process only.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> @state.on_last_process
            ... def print_something():
            ...     print(f"Printed on process {state.process_index}")
            >>> print_something()
            Printed on process 0
        """
        return self._gate(function, "on_last_process", lambda: self.is_last_process)

    def on_process(self, function: Callable[..., R] | None = None, process_index: int | None = None) -> Any:
        """Decorator: run the function on the process with global index ``process_index`` only.

        An index no process has (``process_index=2`` on one process) runs nowhere.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> @state.on_process(process_index=2)
            ... def print_something():
            ...     print(f"Printed on process {state.process_index}")
            >>> print_something() is None  # one process: index 2 does not exist
            True
        """
        index = _check_index(function, process_index, "on_process", "process_index")
        return self._gate(function, "on_process", lambda: self.process_index == index)

    def on_local_process(
        self,
        function: Callable[..., R] | None = None,
        local_process_index: int | None = None,
        *,
        local_process_idx: int | None = None,
    ) -> Any:
        """Decorator: run the function on the process with local index ``local_process_index``.

        ``local_process_idx=`` is accepted too (the spelling of Accelerate's tutorial).

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()
            >>> @state.on_local_process(local_process_index=0)
            ... def print_something():
            ...     print(f"Printed on process {state.local_process_index}")
            >>> print_something()
            Printed on process 0
        """
        if local_process_idx is not None:
            if local_process_index is not None and local_process_index != local_process_idx:
                raise TypeError(
                    f"on_local_process got local_process_index={local_process_index!r} and "
                    f"local_process_idx={local_process_idx!r}; they name the same thing, pass one."
                )
            local_process_index = local_process_idx
        index = _check_index(function, local_process_index, "on_local_process", "local_process_index")
        return self._gate(function, "on_local_process", lambda: self.local_process_index == index)

    def _gate(self, function: Callable[..., R] | None, name: str, runs_here: Callable[[], bool]) -> Any:
        if function is None:  # called with arguments: return the decorator itself
            return lambda fn: self._gate(fn, name, runs_here)
        if not callable(function):
            raise TypeError(f"{name} decorates a function, got {function!r}. Write @state.{name} above a def.")

        # Decided at call time, not decoration time, so functions decorated before a reset or
        # at import time follow the state the call sees.
        @functools.wraps(function)
        def run_here_only(*args: Any, **kwargs: Any) -> R | None:
            return function(*args, **kwargs) if runs_here() else None

        return run_here_only

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` once per machine: on each local main process only.

        Example:
            >>> from nbaccel import PartialState
            >>> PartialState().print("Accelerate is the best")
            Accelerate is the best
        """
        if self.is_local_main_process:
            builtins.print(*args, **kwargs)

    @contextmanager
    def split_between_processes(self, inputs: T, apply_padding: bool = False) -> Iterator[T]:
        """Give each process its contiguous piece of ``inputs`` (see `nbaccel.state.split`).

        Splits list, tuple, dict of those, torch.Tensor, numpy.ndarray and datasets.Dataset along
        the first dimension; the first processes take one item more when it does not divide.
        With ``apply_padding=True`` the input's last element is repeated until every piece is as
        long as the longest (remove the padding after a gather). A str or other input that
        cannot be split is a TypeError. No communication happens.

        Example:
            >>> from nbaccel import PartialState
            >>> state = PartialState()  # with two processes: ["A", "B"] on 0 and ["C"] on 1
            >>> with state.split_between_processes(["A", "B", "C"]) as inputs:
            ...     print(inputs)
            ['A', 'B', 'C']
        """
        yield split_for_process(inputs, self.num_processes, self.process_index, apply_padding)


def _check_index(function: object, index: object, name: str, parameter: str) -> int:
    if function is not None and not callable(function):
        raise TypeError(f"{name}() got {function!r} where the function to decorate goes. Pass the index by keyword: @state.{name}({parameter}={function!r}).")
    if index is None:
        raise TypeError(f"{name} needs the index to run on, e.g. @state.{name}({parameter}=0).")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"{name}: {parameter} must be an int >= 0, got {index!r}.")
    return index
