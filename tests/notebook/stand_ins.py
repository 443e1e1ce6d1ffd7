"""Stand-ins for what the magics start: a launcher that runs rank 0 here, and an in-process pool.

They are handed to the magics through their seams (``register(shell, launch=, start_pool=)``),
and every call is checked against the real function's signature (``inspect.Signature.bind``), so
a magic that calls them in a way the real ones would refuse fails here too; tests/notebook/
test_stand_ins.py keeps `FakePool`'s methods equal to `WorkerPool`'s.
"""

from __future__ import annotations

import inspect
import os
import pickle
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

import nbaccel
from nbaccel.pool import WorkerStatus


class Launches(list):  # type: ignore[type-arg]
    """A stand-in for ``notebook_launcher`` and every call the magic made to it: (function, options).

    Rank 0 runs the cell in this process, "rank 1" returns a marker; ``raises`` makes the launch
    fail with that error instead.
    """

    def __init__(self) -> None:
        super().__init__()
        self.raises: BaseException | None = None

    def __call__(self, function: Any, **options: Any) -> list[Any]:
        inspect.signature(nbaccel.notebook_launcher).bind(function, **options)  # what the real one accepts
        self.append((function, options))
        if self.raises is not None:
            raise self.raises
        return [function(), "rank 1"]

    @property
    def kwargs(self) -> dict[str, Any]:
        assert len(self) == 1, f"expected one launch, got {len(self)}"
        return self[0][1]


class Starts(list):  # type: ignore[type-arg]
    """A stand-in for ``start_workers``: the `FakePool`s it made; ``raises`` refuses to start."""

    def __init__(self) -> None:
        super().__init__()
        self.raises: BaseException | None = None

    def __call__(self, num_processes: int | None = None, **options: Any) -> FakePool:
        inspect.signature(nbaccel.start_workers).bind(num_processes, **options)
        if self.raises is not None:
            raise self.raises
        self.append(FakePool(num_processes or 2, **options))
        return self[-1]


class FakePool:
    """What the magics use of a WorkerPool; every rank's namespace lives in this process.

    Each task runs once per rank after a cloudpickle round trip (as the real pool sends it), so
    names persist per rank exactly as on real workers.
    """

    def __init__(self, num_processes: int = 2, **options: Any) -> None:
        self.options = options
        self.start_method = options.get("start_method", "fork")
        self.num_processes = num_processes
        self.devices = ["cpu"] * num_processes
        self.alive = True
        self.restarted = 0
        self.namespaces: list[dict[str, Any]] = [self._fresh_namespace() for _ in range(num_processes)]
        self.calls: list[dict[str, Any]] = []
        self.last_answers: dict[int, Any] = {}

    @staticmethod
    def _fresh_namespace() -> dict[str, Any]:
        from nbaccel.notebook.cell import predefined_state

        return {"state": predefined_state()}

    def run_task(self, task: Any, ranks: Any = None, timeout: Any = None, output: Any = None, label: str = "", remember: bool = True) -> Any:
        self.calls.append({"ranks": ranks, "timeout": timeout, "output": output, "label": label})
        task = pickle.loads(cloudpickle.dumps(task))
        chosen = range(self.num_processes) if ranks is None else ranks
        answers = {rank: self._on_rank(rank, task) for rank in chosen}
        self.last_answers = answers
        return [answers[rank] for rank in chosen] if ranks is None else answers

    def _on_rank(self, rank: int, task: Any) -> Any:
        saved = os.environ.get("RANK")
        os.environ["RANK"] = str(rank)
        try:
            return pickle.loads(cloudpickle.dumps(task(self.namespaces[rank])))
        finally:
            os.environ.pop("RANK") if saved is None else os.environ.__setitem__("RANK", saved)

    def push(self, shard: bool | Callable[[Any, Any], Any] = False, mesh: Sequence[int] | None = None, **values: Any) -> None:
        if shard:
            raise NotImplementedError("a sharded push needs real ranks (tests/pool/test_sharded.py)")
        for namespace in self.namespaces:
            namespace.update(values)

    def pull(self, name: str, rank: int = 0) -> Any:
        if name not in self.namespaces[rank]:
            raise nbaccel.RankFailedError.__new__(nbaccel.RankFailedError)
        return self.namespaces[rank][name]

    def status(self) -> list[WorkerStatus]:
        last = self.calls[-1]["label"] if self.calls else ""
        return [WorkerStatus(r, 1000 + r, "cpu", "idle", 100.0, None, last) for r in range(self.num_processes)]

    def stop(self, graceful: bool = True) -> None:
        self.alive = False

    def restart(self) -> FakePool:
        self.alive, self.restarted = True, self.restarted + 1
        self.namespaces = [self._fresh_namespace() for _ in range(self.num_processes)]
        return self
