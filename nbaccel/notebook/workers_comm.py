"""The kernel's end of the ``nbaccel.workers`` comm: the extension's workers panel and status item.

``%load_ext nbaccel`` registers the comm target; nothing else happens until a frontend with
nbaccel's JupyterLab extension opens a comm. Then the kernel pushes the workers' status on every
change (start, a cell starting and ending on them, a crash, stop) to every open comm, and answers
``{"request": "status" | "restart" | "stop"}``. Interrupt is not a request: the frontend uses the
kernel's own interrupt, as the notebook's stop button does. A frontend without the extension
opens no comm, so no hook below sends anything or asks the workers anything.

Restart and stop are refused while a cell runs on the workers (JupyterLab may send comm
messages over a subshell, that is while the main thread runs a cell): the lock below makes
"a cell starts" and "stop the workers" happen one after the other, never together.

Example (in the kernel)::

    comm = WorkersComm(shell, lambda: magics.workers)
    comm.register()          # %load_ext nbaccel does this
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nbaccel.notebook.session import NotebookWorkers

COMM_TARGET = "nbaccel.workers"
PROTOCOL_VERSION = 1
WATCH_INTERVAL = 1.0  # seconds between looks at the workers' pids (a crash while idle)


class WorkersComm:
    """Status pushes and requests for the workers of one IPython shell."""

    def __init__(self, shell: Any, workers: Callable[[], NotebookWorkers | None]) -> None:
        self.shell = shell
        self._workers = workers
        self._comms: list[Any] = []
        self._lock = threading.RLock()
        self._busy: tuple[int | None, float] | None = None  # (cell number, monotonic start)
        self._ranks: list[dict[str, Any]] = []  # the last per-rank status read while idle
        self._last_cell: str | None = None
        self._last_pushed: dict[str, Any] | None = None
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- wiring ----------------------------------------------------------------------------------

    def register(self) -> bool:
        """Register the comm target and the cell hooks; False where there is no kernel comm manager."""
        manager = _comm_manager()
        if manager is None:
            return False
        manager.register_target(COMM_TARGET, self._on_open)
        self.shell.events.register("pre_run_cell", self._pre_run_cell)
        self.shell.events.register("post_run_cell", self._post_run_cell)
        return True

    def unregister(self) -> None:
        manager = _comm_manager()
        if manager is not None:
            manager.unregister_target(COMM_TARGET, self._on_open)
        for event, hook in (("pre_run_cell", self._pre_run_cell), ("post_run_cell", self._post_run_cell)):
            with contextlib.suppress(ValueError):
                self.shell.events.unregister(event, hook)
        self._watch_stop.set()
        for comm in list(self._comms):
            with contextlib.suppress(Exception):
                comm.close()
        self._comms.clear()

    # -- what the frontend sends -----------------------------------------------------------------

    def _on_open(self, comm: Any, open_msg: dict[str, Any]) -> None:
        self._comms.append(comm)
        comm.on_msg(self._on_msg)
        comm.on_close(lambda msg: self._forget(comm))
        self._refresh()
        self._last_pushed = self.status_message()
        self._send(comm, self._last_pushed)
        self._ensure_watcher()

    def _on_msg(self, msg: dict[str, Any]) -> None:
        data = msg.get("content", {}).get("data") or {}
        self.handle(str(data.get("request", "")))

    def handle(self, request: str) -> None:
        """Carry out ``request`` and push the status after it (or an error saying why not)."""
        if request == "status":
            self._refresh()
            self.push()
        elif request in ("restart", "stop"):
            error = self._lifecycle(request)
            if error:
                self._broadcast({"type": "error", "request": request, "message": error})
            self.push()
        else:
            self._broadcast({"type": "error", "request": request, "message": f"unknown request {request!r}; expected status, restart or stop"})

    def _lifecycle(self, request: str) -> str | None:
        """Stop or restart the workers now, or the reason it cannot be done."""
        with self._lock:
            workers = self._workers()
            if self._busy is not None:
                return f"a cell is running on the workers; interrupt it first, then {request} them"
            if workers is None or (request == "stop" and workers.running() is None) or workers.pool is None:
                return "no workers running: start them with %distributed start [-n N]"
            said = io.StringIO()
            try:
                with contextlib.redirect_stdout(said):  # no cell shows output of a comm message
                    workers.stop() if request == "stop" else workers.restart()
            except Exception as error:  # noqa: BLE001 - reported to the panel, the kernel carries on
                return f"{request} failed: {type(error).__name__}: {error}"
            self._ranks = []
            self._refresh()
        return None

    # -- pushes ----------------------------------------------------------------------------------

    def push(self) -> None:
        """Send the current status to every open comm (nothing when none is open)."""
        if self._comms:
            message = self.status_message()
            self._last_pushed = message
            self._broadcast(message)

    def status_message(self) -> dict[str, Any]:
        """``{"type": "status", "version": 1, "workers": None | {...}}`` (docs/extension.md)."""
        workers = self._workers()
        ended = workers is not None and workers.pool is not None and workers.running() is None
        message = "the workers were stopped after a failure; %distributed restart starts fresh ones" if ended else None
        return {"type": "status", "version": PROTOCOL_VERSION, "workers": self._workers_status(), "message": message}

    def _workers_status(self) -> dict[str, Any] | None:
        workers = self._workers()
        pool = workers.running() if workers is not None else None
        if pool is None:
            return None
        busy = self._busy
        ranks = [dict(rank, state="busy" if busy is not None and rank["state"] == "idle" else rank["state"]) for rank in self._ranks]
        dead = [r for r in ranks if not _alive(r["pid"])]
        for rank in dead:
            rank["state"] = "ended"
        return {
            "state": "crashed" if dead else "busy" if busy is not None else "idle",
            "num_processes": pool.num_processes,
            "cell": busy[0] if busy is not None else None,
            "busy_seconds": round(time.monotonic() - busy[1], 1) if busy is not None else None,
            "message": f"rank(s) {', '.join(str(r['rank']) for r in dead)} ended" if dead else None,
            "ranks": ranks,
        }

    def _refresh(self) -> None:
        """Re-read each rank's pid, device, memory and last cell, when the workers are idle."""
        workers = self._workers()
        pool = workers.running() if workers is not None else None
        if pool is None:
            self._ranks = []
            return
        if self._busy is not None:
            return
        with self._lock:
            try:
                statuses = pool.status()  # a round trip to idle workers (their GPU memory)
            except Exception:  # noqa: BLE001 - a crashed pool: the next push says so
                return
        self._ranks = [
            {
                "rank": s.rank,
                "pid": s.pid,
                "device": s.device,
                "state": s.state,
                "host_memory": int(s.memory_mb * 2**20),
                "gpu_memory": None if s.device_memory_mb is None else int(s.device_memory_mb * 2**20),
                "cpu_percent": s.cpu_percent,
                "peak_host_memory": None if s.peak_memory_mb is None else int(s.peak_memory_mb * 2**20),
                "gpu_reserved": None if s.device_reserved_mb is None else int(s.device_reserved_mb * 2**20),
                "gpu_device_used": None if s.device_used_mb is None else int(s.device_used_mb * 2**20),
                "gpu_held": None if s.gpu_held_mb is None else int(s.gpu_held_mb * 2**20),
                "peak_gpu_held": None if s.gpu_peak_mb is None else int(s.gpu_peak_mb * 2**20),
                "gpu_util": s.gpu_util,
                "last_cell": self._last_cell or s.last_cell or None,
                "node": None,
            }
            for s in statuses
        ]

    # -- cell hooks (main thread) ----------------------------------------------------------------

    def _pre_run_cell(self, info: Any) -> None:
        if not self._comms:
            return
        workers = self._workers()
        source = str(getattr(info, "raw_cell", "") or "")
        if workers is None or workers.running() is None or not source.lstrip().startswith("%%distributed"):
            return
        with self._lock:  # a stop from a subshell finishes first, or waits for this cell's end
            if workers.running() is None:
                return
            self._refresh()
            number = _cell_number(self.shell, info)
            self._busy = (number, time.monotonic())
            self._last_cell = f"[{number}]" if number is not None else None
        self.push()

    def _post_run_cell(self, result: Any) -> None:
        was_busy, self._busy = self._busy, None
        if was_busy is not None and getattr(result, "execution_count", None) is not None:
            self._last_cell = f"[{result.execution_count}]"
        if not self._comms:
            return
        self._refresh()
        if was_busy is not None or self.status_message() != self._last_pushed:
            self.push()
        self._ensure_watcher()

    # -- a crash while nobody runs a cell ------------------------------------------------------------

    def _ensure_watcher(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._watch_stop.clear()
            self._watcher = threading.Thread(target=self._watch, name="nbaccel-workers-comm", daemon=True)
            self._watcher.start()

    def _watch(self) -> None:
        """Push once when a worker's process ends on its own (killed, crashed) between pushes."""
        reported: set[int] = set()
        while not self._watch_stop.wait(WATCH_INTERVAL) and self._comms:
            dead = {r["pid"] for r in self._ranks if not _alive(r["pid"])}
            if dead - reported:
                self.push()
            reported = dead

    def _forget(self, comm: Any) -> None:
        with contextlib.suppress(ValueError):
            self._comms.remove(comm)

    def _broadcast(self, message: dict[str, Any]) -> None:
        for comm in list(self._comms):
            self._send(comm, message)

    def _send(self, comm: Any, message: dict[str, Any]) -> None:
        try:
            comm.send(message)
        except Exception:  # noqa: BLE001 - a closed comm: forget it
            self._forget(comm)


def _cell_number(shell: Any, info: Any) -> int | None:
    """The number the running cell shows (In [N]): IPython counts it up before pre_run_cell."""
    count = getattr(shell, "execution_count", None)
    if count is None or not getattr(info, "store_history", True):
        return None
    return int(count) - 1


def _comm_manager() -> Any:
    try:
        from comm import get_comm_manager
    except ImportError:
        return None
    try:
        return get_comm_manager()
    except Exception:  # noqa: BLE001 - no kernel (plain IPython)
        return None


def _alive(pid: int | None) -> bool:
    """True while ``pid`` runs (a zombie that nobody reaped yet counts as ended)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


_ATTACHED: dict[int, WorkersComm] = {}


def attach(ipython: Any) -> WorkersComm | None:
    """Register the comm target for ``ipython``'s workers (``%load_ext nbaccel``); once per shell."""
    if id(ipython) in _ATTACHED:
        return _ATTACHED[id(ipython)]

    def workers() -> NotebookWorkers | None:
        magics = ipython.magics_manager.registry.get("DistributedMagics")
        return getattr(magics, "workers", None)

    comm = WorkersComm(ipython, workers)
    if not comm.register():
        return None
    _ATTACHED[id(ipython)] = comm
    return comm


def detach(ipython: Any) -> None:
    """Undo ``attach`` (``%unload_ext nbaccel``)."""
    comm = _ATTACHED.pop(id(ipython), None)
    if comm is not None:
        comm.unregister()
