"""``%%distributed`` and ``%distributed``: thin adapters over ``notebook_launcher`` and the workers.

Parsing lives in IPython's ``magic_arguments`` (so ``%%distributed?`` and ``%distributed?`` print
the options), the cell is compiled in ``nbaccel.notebook.cell``, and either ``nbaccel.notebook_launcher``
runs it once (no workers running) or the persistent workers run it (``nbaccel.notebook.pool_cells``,
``nbaccel.notebook.session``). This module only translates between them: options to arguments,
user mistakes to a one-line ``UsageError``, rank 0's value to the cell's ``Out[]``.

Example (in a notebook)::

    %load_ext nbaccel

    %%distributed -n 2 -o everyone
    state.print(f"hello from rank {state.process_index}")
    state.process_index * 10       # Out[]: 0 (rank 0's value); everyone == [0, 10]

    %distributed start -n 2         # from now on cells run on two persistent workers
"""

from __future__ import annotations

import argparse
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core import magic_arguments
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from nbaccel.errors import NbaccelError, PreflightError
from nbaccel.launch.debug_desk import wants_post_mortem
from nbaccel.launch.notices import say
from nbaccel.launcher import notebook_launcher, start_workers
from nbaccel.notebook import pool_commands as worker_commands
from nbaccel.notebook.cell import compile_cell, compile_pool_cell
from nbaccel.notebook.magic_options import (
    CELL_OPTIONS,
    LAUNCH_OPTIONS,
    check_for_workers,
    check_one_shot,
    launcher_arguments,
    options_decorator,
    output_mode,
    unsplittable,
    with_cluster,
)
from nbaccel.notebook.session import NotebookWorkers, StartPool

if TYPE_CHECKING:
    from IPython.core.interactiveshell import InteractiveShell

MAGIC_NAME = "distributed"

Launch = Callable[..., list[Any]]  # notebook_launcher's shape: (function, **options) -> every rank's value

__all__ = ["CellSyntaxError", "DistributedMagics", "launcher_arguments", "register", "unregister"]


@magics_class
class DistributedMagics(Magics):
    """``%%distributed`` runs a cell on every rank; ``%distributed`` drives persistent workers.

    Without workers each ``%%distributed`` cell is a one-shot launch (``notebook_launcher``);
    after ``%distributed start`` cells run on the workers (``nbaccel.notebook.pool_cells``), which this
    instance holds (``self.workers``) until ``%distributed stop`` or ``%unload_ext nbaccel``.
    """

    shell: InteractiveShell  # never None here: IPython's register_magics passes its shell

    def __init__(self, shell: Any = None, *, launch: Launch = notebook_launcher, start_pool: StartPool = start_workers, **kwargs: Any) -> None:
        """``launch`` runs a one-shot cell, ``start_pool`` starts workers: nbaccel's own by default.

        Tests (and tools built on the magics) pass their own, e.g.
        ``register(shell, launch=recording_launcher)``.
        """
        super().__init__(shell, **kwargs)
        self.launch = launch
        self.workers = NotebookWorkers(lambda: self.shell.user_ns, start_pool)

    @line_magic(MAGIC_NAME)  # type: ignore[arg-type]  # IPython's stub: unbound TypeVar, read as Never
    def distributed_line(self, line: str) -> None:
        __tracebackhide__ = True
        self.workers.run(worker_commands.parse(line))

    distributed_line.__doc__ = worker_commands.help_text()  # type: ignore[assignment]  # what %distributed? shows (Never: see above)

    @magic_arguments.magic_arguments(name=f"%{MAGIC_NAME}")  # type: ignore[no-untyped-call, untyped-decorator]  # unannotated; IPython adds one %: the help says %%distributed
    @options_decorator((*LAUNCH_OPTIONS, *CELL_OPTIONS))
    @cell_magic(MAGIC_NAME)  # type: ignore[arg-type]  # IPython's stub, as line_magic above
    def distributed_cell(self, line: str, cell: str) -> Any:
        """Run this cell on every rank; show rank 0's value.

        Without running workers the cell is a one-shot launch: it runs as the body of a function
        on ranks started for it, sees the notebook's variables as they are at launch, and the
        names it assigns end with it. After `%distributed start` it runs on the workers instead:
        each rank runs it in its own namespace, which keeps the names it assigns for the next
        cell (`%distributed?` for the workers' commands). Either way `state` is predefined:
        nbaccel's PartialState (rank, world size, device, helpers), set up on first use (a
        cell that never touches it creates no process group). The
        value of the cell's last expression on rank 0 is the cell's result (a trailing `;` hides
        it); -o NAME keeps every rank's value. Output is labelled by rank.

        Example::

            %%distributed -n 2 -o ranks
            import torch, torch.distributed as dist
            t = torch.ones(1) * state.process_index
            dist.all_reduce(t)
            t.item()
        """
        __tracebackhide__ = True  # IPython: the user's error is in the cell, not in this adapter
        args = self._parse(line)
        pool = self.workers.running()
        if pool is not None:
            return self._run_on_workers(pool, args, line, cell)
        return self._launch_once(args, line, cell)

    def _run_on_workers(self, pool: Any, args: argparse.Namespace, line: str, cell: str) -> Any:
        __tracebackhide__ = True
        from nbaccel.notebook.pool_cells import run_cell

        check_for_workers(args, pool.num_processes)
        output = output_mode(args)
        compiled = self._compile(line, cell, compile_pool_cell)
        self.workers.mode = "workers"
        pdb = wants_post_mortem(True if args.pdb else None)
        shown, values = run_cell(
            pool, compiled, args.ranks, collect=args.out is not None, timeout=args.timeout, output=output, pdb=pdb, profile=args.profile or False
        )
        if args.out is not None:
            self.shell.user_ns[args.out] = values
        return shown

    def _launch_once(self, args: argparse.Namespace, line: str, cell: str) -> Any:
        __tracebackhide__ = True
        check_one_shot(args)
        kwargs = with_cluster(launcher_arguments(args), args, self.shell.user_ns, f"%%{MAGIC_NAME}")
        function = self._compile(line, cell, lambda source, **options: compile_cell(source, self.shell.user_ns, **options))
        function.label = f"cell [{self._cell_number()}]"  # its ranks in ps and nvidia-smi: nbaccel rank 1/4 (cell [12])
        note = self.workers.one_shot_note(kwargs.get("num_processes") or len(kwargs.get("gpus") or ()))
        if note:
            say(note)
        values = self._launch(function, kwargs)
        if args.out is not None:
            self.shell.user_ns[args.out] = values
        return values[0] if values else None

    def _parse(self, line: str) -> argparse.Namespace:
        try:
            parsed: argparse.Namespace = magic_arguments.parse_argstring(self.distributed_cell, line)  # type: ignore[no-untyped-call]  # unannotated: argparse's Namespace
            return parsed
        except ValueError as error:  # shlex: "No closing quotation"
            raise unsplittable(f"%%{MAGIC_NAME}", line, error) from None

    def _compile(self, line: str, cell: str, compiler: Callable[..., Any]) -> Any:
        """``compiler(source, header=, cache=, flags=)`` of the transformed cell; syntax errors as CellSyntaxError."""
        __tracebackhide__ = True
        if not cell.strip():
            raise UsageError(f"%%{MAGIC_NAME} runs the code below it on every rank, and this cell has none: write the code under the %%{MAGIC_NAME} line.")
        lines = cell.splitlines()
        blank = next(i for i, text in enumerate(lines) if text.strip())
        # IPython drops leading blank lines when it transforms a cell: keep them in the header, so
        # traceback line numbers still count from the magic's line, as the notebook shows the cell.
        header = f"%%{MAGIC_NAME} {line}".rstrip() + "\n" * blank
        try:
            source = self.shell.transform_cell(cell)  # type: ignore[no-untyped-call]  # unannotated in IPython; !cmd, %magic ... become Python, as in any cell
            return compiler(source, header=header, cache=self._cache, flags=self.shell.compile.flags)
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
        try:
            return self.launch(function, **kwargs)
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


def register(ipython: Any, *, launch: Launch = notebook_launcher, start_pool: StartPool = start_workers) -> DistributedMagics:
    """Add ``%%distributed`` and ``%distributed`` to ``ipython`` (what ``%load_ext nbaccel`` calls).

    ``launch`` and ``start_pool`` are what the magics run cells and start workers with (see
    `DistributedMagics`). Magics registered before are replaced, their workers stopped.

    Example:
        >>> calls = []
        >>> def recording_launcher(function, **options):
        ...     calls.append(options)
        ...     return [function()]
        >>> magics = register(get_ipython(), launch=recording_launcher)  # doctest: +SKIP
    """
    unregister(ipython)
    magics = DistributedMagics(ipython, launch=launch, start_pool=start_pool)
    ipython.register_magics(magics)
    return magics


def unregister(ipython: Any) -> None:
    """Remove what ``register`` added (what ``%unload_ext nbaccel`` calls)."""
    manager = ipython.magics_manager
    instance = manager.registry.pop(DistributedMagics.__name__, None)
    if instance is None:
        return
    instance.workers.close()  # nothing could reach them once the magics are gone
    # IPython has no public way to drop a magic: remove the table entries bound to our instance.
    for table in manager.magics.values():
        for name, function in list(table.items()):
            if getattr(function, "__self__", None) is instance:
                del table[name]
