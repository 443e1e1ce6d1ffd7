"""The notebook's persistent workers, as the ``%distributed`` commands drive them.

One pool per IPython shell (held by its magics), started with the notebook's namespace as every
rank's first namespace. Each command is a small method; what it did is said with
``nbaccel.launch.notices.say`` (stdout; NBACCEL_QUIET=1 silences it); mistakes a user can fix are one-line
``UsageError``s, and what the workers raise while running code (a failing or crashing rank) is
left as it is.

Example (in a notebook)::

    %distributed start -n 2      # workers = NotebookWorkers(user_ns, start_workers); workers.start(args)
    %distributed push data
    %distributed status
    %distributed stop
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from nbaccel.launch.notices import say
from nbaccel.notebook.magic_options import launch_options, start_options, with_cluster
from nbaccel.notebook.worker_tables import StatusTable, free_table

if TYPE_CHECKING:
    from nbaccel.pool import WorkerPool

NO_WORKERS = "no workers running: start them with %distributed start [-n N]"


StartPool = Callable[..., "WorkerPool"]  # start_workers' shape: (num_processes=, cpu=, namespace=, ...) -> a pool


class NotebookWorkers:
    """At most one running pool for the notebook whose variables ``namespace()`` returns.

    ``start_pool`` starts it (``nbaccel.start_workers``, or a stand-in a test passes).
    """

    def __init__(self, namespace: Callable[[], dict[str, Any]], start_pool: StartPool) -> None:
        self._namespace = namespace
        self._start_pool = start_pool
        self.pool: WorkerPool | None = None  # kept after a crash, so `restart` knows the options
        self.mode: str | None = None  # how the last %%distributed cell ran: "workers" or "one-shot"
        self._watch: tuple[Any, Callable[..., None]] | None = None  # (shell, post_run_cell hook) of `status --watch`

    @property
    def user_ns(self) -> dict[str, Any]:
        return self._namespace()

    def running(self) -> WorkerPool | None:
        """The pool when its workers are alive (after a crash or stop: None)."""
        return self.pool if self.pool is not None and self.pool.alive else None

    def require(self) -> WorkerPool:
        pool = self.running()
        if pool is None:
            raise UsageError(NO_WORKERS + ".")
        return pool

    def run(self, args: argparse.Namespace) -> None:
        """Carry out one parsed ``%distributed`` command."""
        if args.command == "push":
            self.push(args.names, args.shard, args.mesh)
        elif args.command == "pull":
            self.pull(args.name, args.rank, args.out)
        else:
            getattr(self, args.command)(args)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, args: argparse.Namespace) -> None:
        running = self.running()
        if running is not None:
            raise UsageError(
                f"{running.num_processes} workers are already running: %distributed stop first (or %distributed restart for fresh ones with the same options)."
            )
        from nbaccel.errors import PreflightError

        options = with_cluster(start_options(args), args, self.user_ns, "%distributed start")
        started = time.monotonic()
        try:
            self.pool = self._start_pool(namespace=self.user_ns, **options)
        except (ValueError, TypeError, PreflightError) as error:  # refused before any rank started
            raise UsageError(f"%distributed start: {error}") from None
        self._say_ready(time.monotonic() - started)

    def stop(self, args: argparse.Namespace | None = None) -> None:
        pool, self.pool = self.pool, None
        if pool is None or not pool.alive:
            say(NO_WORKERS)
            return
        pool.stop()
        say(f"{pool.num_processes} workers stopped; %%distributed cells are one-shot launches again")

    def restart(self, args: argparse.Namespace | None = None) -> None:
        if self.pool is None:
            raise UsageError(f"no workers to restart: {NO_WORKERS}.")
        wait_for = getattr(args, "wait_for", None)
        started = time.monotonic()
        if wait_for is None:
            self.pool.restart()
        elif hasattr(self.pool, "cluster"):  # a pool across nodes: come back once N nodes are there
            self.pool.restart(wait_for=wait_for, settle=getattr(args, "settle", 0.0))  # type: ignore[call-arg]
        else:
            raise UsageError(
                f"%distributed restart --wait-for {wait_for}: these workers run on this machine only; --wait-for is for a pool across nodes (--cluster)."
            )
        self._say_ready(time.monotonic() - started, fresh=True)

    def plan(self, args: argparse.Namespace) -> None:
        """``%distributed plan``: ``nbaccel.plan()`` of the options, printed (the answer, even with NBACCEL_QUIET=1)."""
        from nbaccel.errors import PreflightError
        from nbaccel.launcher import plan

        options, given = launch_options(args, "%distributed plan")
        kwargs = with_cluster({name: getattr(options, name) for name in given}, args, self.user_ns, "%distributed plan")
        try:
            print(plan(**kwargs))
        except (ValueError, TypeError, PreflightError) as error:
            raise UsageError(f"%distributed plan: {error}") from None

    def cluster(self, args: argparse.Namespace) -> None:
        from nbaccel.notebook.cluster_command import start_cluster

        start_cluster(args, self.user_ns)

    def close(self) -> None:
        """Stop the workers quietly (the extension is unloaded)."""
        self._unwatch()
        pool, self.pool = self.pool, None
        if pool is not None and pool.alive:
            pool.stop()
            say(f"stopped the {pool.num_processes} workers of the unloaded extension")

    def _say_ready(self, took: float, fresh: bool = False) -> None:
        assert self.pool is not None
        devices = sorted(set(self.pool.devices))
        where = ", ".join(devices)
        state = "fresh namespaces" if fresh else "%%distributed cells run on them"
        say(f"{self.pool.num_processes} workers ready on {where} in {took:.2f} s; {state} until %distributed stop")
        if not fresh and self.pool.start_method != "fork":
            # auto falls back to the fork server (or spawn) when CUDA is initialised here: the
            # workers were not forked from the kernel, so the notebook's names are not there
            say(f"workers started by {self.pool.start_method} begin with empty namespaces: %distributed push what the cells need")

    def one_shot_note(self, num_processes: int) -> str | None:
        """The notice that says a cell is a one-shot launch: only when the mode changes.

        The first one-shot cell of a session says it, and so does the first one after workers
        stopped or broke; a notebook that never starts workers is told once, not every cell.
        """
        if self.mode == "one-shot":
            return None
        self.mode = "one-shot"
        ended = " (stopped after a failure)" if self.pool is not None else ""
        of = f" of {num_processes} ranks" if num_processes else ""
        return f"no workers running{ended}; one-shot launch{of}"

    # -- inspection and transfers ----------------------------------------------------------------

    def status(self, args: argparse.Namespace | None = None) -> None:
        """The workers' table (html and text); with ``--watch``, kept up to date after every cell."""
        if self.running() is None:
            ended = self.pool is not None  # torn down after a failure, not stopped by the user
            # The answer to the command, not a notice: shown even with NBACCEL_QUIET=1.
            print(f"nbaccel: {NO_WORKERS}" + (" (or %distributed restart, with the same options)" if ended else ""))
            return
        from IPython.display import display

        if not getattr(args, "watch", False):
            display(StatusTable(self.require().status()))  # type: ignore[no-untyped-call]
            return
        handle = display(self._watched_table(), display_id=True)  # type: ignore[no-untyped-call]
        self._start_watch(handle)

    def _watched_table(self) -> StatusTable | str:
        pool = self.running()
        if pool is None:
            return f"nbaccel: {NO_WORKERS} (this table was watched until they stopped)"
        return StatusTable(pool.status(), note=f"watched: read again after every cell; last read at {time.strftime('%H:%M:%S')}")

    def _start_watch(self, handle: Any) -> None:
        """Refresh ``handle`` after every later cell (IPython's post_run_cell, on the kernel's
        main thread) until the workers stop; one watched table at a time."""
        from IPython import get_ipython

        self._unwatch()
        shell = get_ipython()
        if shell is None or handle is None:
            return

        def refresh(result: Any = None) -> None:
            try:
                table = self._watched_table()
                handle.update(table)
            except Exception as error:  # noqa: BLE001 - a watch must never break the user's cells
                say(f"%distributed status --watch stopped: {type(error).__name__}: {error}")
                table = ""
            if not isinstance(table, StatusTable):
                self._unwatch()

        shell.events.register("post_run_cell", refresh)
        self._watch = (shell, refresh)

    def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            shell, hook = watch
            with contextlib.suppress(ValueError):
                shell.events.unregister("post_run_cell", hook)

    def free(self, args: argparse.Namespace | None = None) -> None:
        """``gc.collect()`` and ``torch.cuda.empty_cache()`` on every rank; what each freed."""
        print(free_table(self.require().free()))

    def stacks(self, args: argparse.Namespace | None = None) -> None:
        if self.running() is None:
            print(f"nbaccel: {NO_WORKERS}")  # the answer to the command: shown even with NBACCEL_QUIET=1
            return
        stacks = self.require().stacks()
        print("\n".join(stack.summary for stack in stacks))
        for stack in stacks:
            print(f"\n── rank {stack.rank} ──\n{stack.text.rstrip()}")

    def debug(self, args: argparse.Namespace) -> None:
        pool = self.require()
        if args.rank is not None and args.rank >= pool.num_processes:
            raise UsageError(f"%distributed debug --rank {args.rank}: the workers are ranks 0..{pool.num_processes - 1}.")
        try:
            pool.debug(rank=args.rank)
        except LookupError as error:
            raise UsageError(f"%distributed debug: {error}") from None

    def push(self, names: list[str], shard: bool | str = False, mesh: tuple[int, ...] | None = None) -> None:
        pool = self.require()
        missing = [name for name in names if name not in self.user_ns]
        if missing:
            raise UsageError(f"%distributed push: {_names(missing)} not defined in the notebook; define it first, or check the spelling.")
        if mesh is not None and not shard:
            raise UsageError("%distributed push: --mesh shapes a sharded push; add --shard (or drop --mesh).")
        how: bool | Callable[[Any, Any], Any] = shard is True
        if isinstance(shard, str):  # --shard RECIPE: a notebook function recipe(module, mesh)
            recipe = self.user_ns.get(shard)
            if not callable(recipe):
                raise UsageError(f"%distributed push --shard {shard}: {shard!r} is not a function in the notebook; define recipe(module, mesh) first.")
            how = recipe
        try:
            pool.push(shard=how, mesh=mesh, **{name: self.user_ns[name] for name in names})
        except (TypeError, ValueError) as error:  # the pool names the value it cannot push, or the mesh that does not fit
            raise UsageError(f"%distributed push: {error}") from None

    def save(self, args: argparse.Namespace) -> None:
        """``%distributed save DIR NAME...``: DCP on every rank, atomic."""
        path = self._checkpoint("save", lambda pool: pool.save(args.directory, *args.names))
        say(f"saved {', '.join(args.names)} to {path} on {self.require().num_processes} ranks")

    def load(self, args: argparse.Namespace) -> None:
        """``%distributed load DIR NAME...``: resharded onto these ranks."""
        self._checkpoint("load", lambda pool: pool.load(args.directory, *args.names))
        say(f"loaded {', '.join(args.names)} from {args.directory} onto {self.require().num_processes} ranks")

    def _checkpoint(self, command: str, call: Callable[[WorkerPool], Any]) -> Any:
        from nbaccel.errors import CheckpointError

        pool = self.require()
        try:
            return call(pool)
        except CheckpointError as error:  # refused on every rank alike, before any write: the workers are kept
            raise UsageError(f"%distributed {command}: {error}") from None

    def pull(self, name: str, rank: int, out: str | None) -> None:
        pool = self.require()
        if rank >= pool.num_processes:
            raise UsageError(f"%distributed pull: --rank {rank} is outside the {pool.num_processes} workers (ranks 0..{pool.num_processes - 1}).")
        from nbaccel.errors import RankFailedError

        try:
            value = pool.pull(name, rank=rank)
        except RankFailedError as error:
            if error.exc_type != "NameError":
                raise
            raise UsageError(f"%distributed pull: {error.error_message} (rank {rank}).") from None
        self.user_ns[out or name] = value


def _names(names: list[str]) -> str:
    quoted = ", ".join(repr(name) for name in names)
    return f"{quoted} is" if len(names) == 1 else f"{quoted} are"
