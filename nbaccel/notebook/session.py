"""The notebook's persistent workers, as the ``%distributed`` commands drive them.

One pool per IPython shell (held by its magics), started with the notebook's namespace as every
rank's first namespace. Each command is a small method; mistakes a user can fix are one-line
``UsageError``s, and what the workers raise while running code (a failing or crashing rank) is
left as it is.

Example (in a notebook)::

    %distributed start -n 2      # workers = NotebookWorkers(user_ns); workers.start(args)
    %distributed push data
    %distributed status
    %distributed stop
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from nbaccel.pool import WorkerPool, WorkerStatus

_START_OPTIONS = ("num_processes", "gpus", "mixed_precision", "start_method")
NO_WORKERS = "no workers running: start them with %distributed start [-n N]"


class NotebookWorkers:
    """At most one running pool for the notebook whose variables ``namespace()`` returns."""

    def __init__(self, namespace: Callable[[], dict[str, Any]]) -> None:
        self._namespace = namespace
        self.pool: WorkerPool | None = None  # kept after a crash, so `restart` knows the options
        self.mode: str | None = None  # how the last %%distributed cell ran: "workers" or "one-shot"

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
            self.push(args.names)
        elif args.command == "pull":
            self.pull(args.name, args.rank, args.out)
        else:
            getattr(self, args.command)(args)

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, args: argparse.Namespace) -> None:
        running = self.running()
        if running is not None:
            raise UsageError(
                f"{running.num_processes} workers are already running: %distributed stop first "
                "(or %distributed restart for fresh ones with the same options)."
            )
        from nbaccel import start_workers
        from nbaccel.errors import PreflightError

        options = {name: getattr(args, name) for name in _START_OPTIONS if getattr(args, name) is not None}
        if getattr(args, "cluster", None) is not None:
            options = self._on_cluster(args.cluster, options)
        started = time.monotonic()
        try:
            self.pool = start_workers(cpu=args.cpu, namespace=self.user_ns, **options)
        except (ValueError, TypeError, PreflightError) as error:  # refused before any rank started
            raise UsageError(f"%distributed start: {error}") from None
        self._say_ready(time.monotonic() - started)

    def _on_cluster(self, name: str, options: dict[str, Any]) -> dict[str, Any]:
        from nbaccel.agent.cluster import Cluster

        cluster = self.user_ns.get(name)
        if not isinstance(cluster, Cluster):
            raise UsageError(f"%distributed start --cluster {name}: {name!r} is not an nbaccel.Cluster in the notebook (it is {type(cluster).__name__}); make one first: {name} = nbaccel.Cluster('HOST:PORT').")
        clashing = [f"--{option.replace('_', '-')}" for option in ("num_processes", "gpus", "start_method") if option in options]
        if clashing:
            raise UsageError(f"%distributed start --cluster {name} takes its ranks from the nodes' agents (--nproc-per-node there): drop {', '.join(clashing)}.")
        return {**options, "cluster": cluster}

    def stop(self, args: argparse.Namespace | None = None) -> None:
        pool, self.pool = self.pool, None
        if pool is None or not pool.alive:
            print(f"nbaccel: {NO_WORKERS}")
            return
        pool.stop()
        print(f"nbaccel: {pool.num_processes} workers stopped; %%distributed cells are one-shot launches again")

    def restart(self, args: argparse.Namespace | None = None) -> None:
        if self.pool is None:
            raise UsageError(f"no workers to restart: {NO_WORKERS}.")
        started = time.monotonic()
        self.pool.restart()
        self._say_ready(time.monotonic() - started, fresh=True)

    def close(self) -> None:
        """Stop the workers quietly (the extension is unloaded)."""
        pool, self.pool = self.pool, None
        if pool is not None and pool.alive:
            pool.stop()
            print(f"nbaccel: stopped the {pool.num_processes} workers of the unloaded extension", file=sys.stderr)

    def _say_ready(self, took: float, fresh: bool = False) -> None:
        assert self.pool is not None
        devices = sorted(set(self.pool.devices))
        where = ", ".join(devices)
        state = "fresh namespaces" if fresh else "%%distributed cells run on them"
        print(f"nbaccel: {self.pool.num_processes} workers ready on {where} in {took:.2f} s; {state} until %distributed stop")
        if not fresh and self.pool.start_method != "fork":
            # auto falls back to spawn when CUDA is initialised here: the notebook's names are not there
            print("nbaccel: spawned workers start with empty namespaces: %distributed push what the cells need")

    def one_shot_note(self, num_processes: int) -> str | None:
        """The line that says a cell is a one-shot launch: only when the mode changes.

        The first one-shot cell of a session says it, and so does the first one after workers
        stopped or broke; a notebook that never starts workers is told once, not every cell.
        """
        if self.mode == "one-shot":
            return None
        self.mode = "one-shot"
        ended = " (stopped after a failure)" if self.pool is not None else ""
        of = f" of {num_processes} ranks" if num_processes else ""
        return f"nbaccel: no workers running{ended}; one-shot launch{of}"

    # -- inspection and transfers ----------------------------------------------------------------

    def status(self, args: argparse.Namespace | None = None) -> None:
        if self.running() is None:
            ended = self.pool is not None  # torn down after a failure, not stopped by the user
            print(f"nbaccel: {NO_WORKERS}" + (" (or %distributed restart, with the same options)" if ended else ""))
            return
        print(status_table(self.require().status()))

    def push(self, names: list[str]) -> None:
        pool = self.require()
        missing = [name for name in names if name not in self.user_ns]
        if missing:
            raise UsageError(f"%distributed push: {_names(missing)} not defined in the notebook; define it first, or check the spelling.")
        try:
            pool.push(**{name: self.user_ns[name] for name in names})
        except TypeError as error:  # the pool names the value that cannot be pickled
            raise UsageError(f"%distributed push: {error}") from None

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


def status_table(statuses: Iterable[WorkerStatus]) -> str:
    """One row per rank: pid, device, state, memory in use, last cell.

    Example:
        >>> from nbaccel.pool import WorkerStatus
        >>> print(status_table([WorkerStatus(0, 4242, "cpu", "idle", 310.4, None, "x = 1")]))
        rank  pid   device  state  memory   last cell
        0     4242  cpu     idle   310 MiB  x = 1
    """
    rows = [("rank", "pid", "device", "state", "memory", "last cell")]
    for s in statuses:
        memory = f"{s.memory_mb:.0f} MiB" + (f" (+{s.device_memory_mb:.0f} MiB GPU)" if s.device_memory_mb is not None else "")
        rows.append((str(s.rank), str(s.pid), s.device, s.state, memory, s.last_cell or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1] for row in rows)


def _names(names: list[str]) -> str:
    quoted = ", ".join(repr(name) for name in names)
    return f"{quoted} is" if len(names) == 1 else f"{quoted} are"
