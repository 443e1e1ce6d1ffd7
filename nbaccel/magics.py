"""``%%distributed``: run a notebook cell on every rank; a thin adapter over ``notebook_launcher``.

Parsing lives in IPython's ``magic_arguments`` (so ``%%distributed?`` prints the options), the
cell becomes a function in ``nbaccel.cell``, and ``nbaccel.notebook_launcher`` runs it. This
module only translates between them: options to launcher arguments, user mistakes to a one-line
``UsageError``, rank 0's value to the cell's ``Out[]``.

Example (in a notebook)::

    %load_ext nbaccel

    %%distributed -n 2 -o everyone
    state.print(f"hello from rank {state.process_index}")
    state.process_index * 10       # Out[]: 0 (rank 0's value); everyone == [0, 10]
"""

from __future__ import annotations

import argparse
import keyword
import traceback
from typing import Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from .cell import compile_cell
from .env import MIXED_PRECISIONS
from .errors import NbaccelError
from .plan import START_METHODS

MAGIC_NAME = "distributed"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _gpu_list(text: str) -> tuple[int, ...]:
    parts = [part.strip() for part in text.split(",")]
    if not all(part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected device indices separated by commas, e.g. --gpus 0,2,3; got {text!r}")
    return tuple(int(part) for part in parts)


def _variable_name(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"expected a Python variable name to store the results in, got {text!r}")
    return text


def launcher_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The ``notebook_launcher`` keyword arguments that parsed magic options stand for.

    Options left out are left out here too, so the launcher's defaults (and ``NBACCEL_OUTPUT``)
    decide.

    Example:
        >>> ns = argparse.Namespace(num_processes=2, gpus=None, mixed_precision=None, start_method=None,
        ...     timeout=None, max_restarts=None, cpu=False, text=True, widgets=False, out=None)
        >>> launcher_arguments(ns)
        {'num_processes': 2, 'output': 'text'}
    """
    if args.text and args.widgets:
        raise UsageError("--text and --widgets contradict each other: pass one of them (or neither, to choose by itself).")
    kwargs: dict[str, Any] = {}
    for option in ("num_processes", "gpus", "mixed_precision", "start_method", "timeout", "max_restarts"):
        value = getattr(args, option)
        if value is not None:
            kwargs[option] = value
    if args.cpu:
        kwargs["cpu"] = True
    if args.text or args.widgets:
        kwargs["output"] = "text" if args.text else "widgets"
    return kwargs


@magics_class
class DistributedMagics(Magics):
    """The ``%%distributed`` cell magic.

    The ``%distributed`` *line* magic (start/stop/status/push/pull of persistent workers) is a
    later addition: it will be a second method registered with ``@line_magic("distributed")``,
    so the cell magic's options and parser stay as they are.
    """

    @magic_arguments.magic_arguments(name=MAGIC_NAME)
    @magic_arguments.argument("-n", "--num-processes", type=_positive_int, metavar="N", help="ranks to start (default: one per visible GPU, or 2 CPU ranks on gloo)")
    @magic_arguments.argument("--gpus", type=_gpu_list, metavar="0,2,3", help="CUDA devices to use, one rank each (default: the first N)")
    @magic_arguments.argument("--cpu", action="store_true", help="run CPU ranks on gloo even where GPUs are visible")
    @magic_arguments.argument("--mixed-precision", choices=MIXED_PRECISIONS, help="exported to nbaccel's state and Accelerate (default: no)")
    @magic_arguments.argument("--start-method", choices=START_METHODS, help="fork the kernel, or spawn fresh interpreters (default: auto, fork when safe)")
    @magic_arguments.argument("--timeout", type=_seconds, metavar="SECONDS", help="stop every rank after this many seconds")
    @magic_arguments.argument("--max-restarts", type=_non_negative_int, metavar="K", help="relaunch every rank after a failure, up to K times (default: 0)")
    @magic_arguments.argument("-o", "--out", type=_variable_name, metavar="NAME", help="store the list of every rank's value, by rank, in NAME")
    @magic_arguments.argument("--text", action="store_true", help="show output as text lines labelled [rank N]")
    @magic_arguments.argument("--widgets", action="store_true", help="show output in per-rank widgets (default: NBACCEL_OUTPUT, else auto)")
    @cell_magic(MAGIC_NAME)
    def distributed_cell(self, line: str, cell: str) -> Any:
        """Run this cell on every rank, as the body of a function; show rank 0's value.

        The cell sees the notebook's variables as they are at launch; the names it assigns stay
        on the ranks (use -o, or the last expression, to bring values back). `state` is
        predefined: nbaccel's PartialState (rank, world size, device, helpers), created on first
        use. The value of the cell's last expression on rank 0 is the cell's result (a trailing
        `;` hides it); every rank's value goes to -o NAME. Output is labelled by rank.

        Example::

            %%distributed -n 2 -o ranks
            import torch, torch.distributed as dist
            t = torch.ones(1) * state.process_index
            dist.all_reduce(t)
            t.item()
        """
        __tracebackhide__ = True  # IPython: the user's error is in the cell, not in this adapter
        args = self._parse(line)
        kwargs = launcher_arguments(args)
        function = self._compile(line, cell)
        values = self._launch(function, kwargs)
        if args.out is not None:
            self.shell.user_ns[args.out] = values
        return values[0] if values else None

    def _parse(self, line: str) -> argparse.Namespace:
        try:
            return magic_arguments.parse_argstring(self.distributed_cell, line)
        except ValueError as error:  # shlex: "No closing quotation"
            raise UsageError(f"%%{MAGIC_NAME} {line.strip()}: {error}") from None

    def _compile(self, line: str, cell: str) -> Any:
        __tracebackhide__ = True
        if not cell.strip():
            raise UsageError(
                f"%%{MAGIC_NAME} runs the code below it on every rank, and this cell has none: "
                f"write the code under the %%{MAGIC_NAME} line."
            )
        lines = cell.splitlines()
        blank = next(i for i, text in enumerate(lines) if text.strip())
        # IPython drops leading blank lines when it transforms a cell: keep them in the header, so
        # traceback line numbers still count from the magic's line, as the notebook shows the cell.
        header = f"%%{MAGIC_NAME} {line}".rstrip() + "\n" * blank
        try:
            source = self.shell.transform_cell(cell)  # !cmd, %magic ... become Python, as in any cell
            return compile_cell(source, self.shell.user_ns, header=header, cache=self._cache, flags=self.shell.compile.flags)
        except SyntaxError as error:
            raise CellSyntaxError(error, self.shell) from None

    def _cache(self, text: str) -> str:
        # ipykernel names a cell's file after a hash of its raw source; a distinct raw_code keeps
        # this entry from replacing the kernel's own entry for the very same cell.
        raw = f"{text}\n# nbaccel: the %%{MAGIC_NAME} cell body"
        return str(self.shell.compile.cache(text, self._cell_number(), raw_code=raw))

    def _cell_number(self) -> int:
        # IPython counts execution_count up *before* running a cell; the running cell's own
        # number (the N of In[N]) is on the result the display hook is filling.
        running = getattr(self.shell.displayhook, "exec_result", None)
        number = getattr(running, "execution_count", None)
        return int(number if number is not None else self.shell.execution_count)

    def _launch(self, function: Any, kwargs: dict[str, Any]) -> list[Any]:
        __tracebackhide__ = True
        from . import launcher
        from .errors import PreflightError

        try:
            return launcher.notebook_launcher(function, **kwargs)
        except (ValueError, PreflightError) as error:
            # Raised before any rank starts: a wrong option value or a kernel that cannot fork.
            raise UsageError(f"%%{MAGIC_NAME}: {error}") from None


class CellSyntaxError(NbaccelError):
    """The ``%%distributed`` cell is not valid Python; raised in the kernel, before any rank starts.

    ``syntax_error`` is Python's SyntaxError, with the cell's file name and line. IPython shows
    it as it shows a syntax error in a plain cell: the line and a caret. (A SyntaxError itself
    would be printed with every frame down to the raise, this adapter's included: IPython
    ignores ``__tracebackhide__`` for syntax errors.)
    """

    def __init__(self, error: SyntaxError, shell: Any = None) -> None:
        super().__init__(f"{error.msg} (line {error.lineno} of the cell)")
        self.syntax_error = error
        self._shell = shell

    def _render_traceback_(self) -> list[str]:
        if self._shell is None:
            return traceback.format_exception_only(SyntaxError, self.syntax_error)
        return list(self._shell.SyntaxTB.structured_traceback(SyntaxError, self.syntax_error, []))


def register(ipython: Any) -> None:
    """Add ``%%distributed`` to ``ipython`` (what ``%load_ext nbaccel`` calls)."""
    ipython.register_magics(DistributedMagics)


def unregister(ipython: Any) -> None:
    """Remove what ``register`` added (what ``%unload_ext nbaccel`` calls)."""
    manager = ipython.magics_manager
    instance = manager.registry.pop(DistributedMagics.__name__, None)
    if instance is None:
        return
    # IPython has no public way to drop a magic: remove the table entries bound to our instance.
    for table in manager.magics.values():
        for name, function in list(table.items()):
            if getattr(function, "__self__", None) is instance:
                del table[name]
