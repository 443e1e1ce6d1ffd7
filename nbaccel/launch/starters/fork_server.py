"""The kernel's handle on its fork server, and the ``RankStarter`` that starts ranks through it.

A kernel that touched CUDA (or holds a process group) cannot fork ranks. The fork server is a
small process that never does: forked from the kernel while it is still fork-safe (at
``import nbaccel`` in a kernel, or ``%load_ext nbaccel``: the modules it had then are shared, not
copied), or, when the kernel was unsafe before nbaccel came, exec'd fresh and warmed by importing
the kernel's heavy modules by name (torch, numpy). Its ranks are forked from it in milliseconds:
the function and its arguments travel by value (cloudpickle, pickled once per launch, in a memfd),
the kernel's current environment, ``sys.path`` and working directory with them.

The server is nbaccel's own, not ``multiprocessing``'s forkserver: that one pickles targets by
reference (lambdas and notebook functions fail), is always exec'd (143 MiB of its own with torch,
2x a fork on trivial launches), shares the kernel's process group (Jupyter's interrupt reaches
it) and, when the kernel is SIGKILLed, leaves running children behind (research/speed.md). This
one passes each rank's pipes with SCM_RIGHTS, relays exit codes (the ranks are its children, not
the kernel's) and hands the kernel a pidfd per rank, so the one event loop is unchanged.

Example::

    starter = ServerStarter(fork_server())
    group = LocalRankGroup.start(starter, job, plan, attempt=0, persistent=False)
"""

from __future__ import annotations

import atexit
import gc
import os
import select
import signal
import socket
import sys
import time
import warnings
from typing import TYPE_CHECKING, Any

from nbaccel.launch.notices import say
from nbaccel.launch.preflight import fork_hazards
from nbaccel.launch.processes import RankProcess
from nbaccel.rank.server_loop import serve
from nbaccel.wire.fork_server_messages import recv_message, send_message

if TYPE_CHECKING:  # imported when a launch needs them: `import nbaccel` forks the server, cheaply
    from nbaccel.wire.job import ChildEnds, Job

MODE_VARIABLE = "NBACCEL_FORK_SERVER"  # "eager" (default), "lazy" (only when needed) or "off"
WARM_MODULES = ("torch", "torch.distributed", "numpy", "nbaccel.rank.bootstrap")
_SOCKET_BUFFER = 1 << 20  # a request holds the kernel's whole environment
_REPLY_WAIT = 300.0  # an exec'd server imports torch before it answers the first request
_REFRESH_ABOVE = 24 << 20  # own memory (USS) past which an idle server is forked anew, when it can be
_EXIT_WAIT = 5.0  # the rank ended (its pidfd said so); its code follows from the server at once


class ForkServerError(OSError):
    """The fork server could not be started or answered nothing."""


class ForkServer:
    """A running server: its pid, the kernel's end of the socket, and exit codes relayed so far."""

    def __init__(self, sock: socket.socket, pid: int, how: str, modules: frozenset[str], kernel_had: frozenset[str] = frozenset()) -> None:
        self.sock = sock
        self.pid = pid
        self.how = how  # "forked" from the kernel, or "exec'd" fresh
        self.modules = modules  # the heavy modules it had from the start (shared with the kernel if forked)
        self.kernel_had = kernel_had  # every module the kernel had when the server started
        self.exits: dict[int, int] = {}
        self.running: set[int] = set()  # ranks started and not yet ended
        self._gone = False

    def alive(self) -> bool:
        if self._gone:
            return False
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid = self.pid
        if pid:
            self._gone = True
        return not self._gone

    def start_rank(self, request: dict[str, Any], fds: list[int]) -> tuple[int, int]:
        """Ask for one rank; its pid and a pidfd for it."""
        try:
            send_message(self.sock, request, fds)
        except OSError as exc:
            raise ForkServerError(f"the fork server (pid {self.pid}) is gone: {exc}") from exc
        deadline = time.monotonic() + _REPLY_WAIT
        while True:
            message, passed = self._next(deadline - time.monotonic())
            if message is None:
                raise ForkServerError(f"the fork server (pid {self.pid}) ended before starting rank {request['rank']}")
            if message["op"] == "started":
                self.running.add(int(message["pid"]))
                return int(message["pid"]), passed[0]
            if message["op"] == "failed":
                raise ForkServerError(f"the fork server could not start rank {request['rank']}: {message['error']}")

    def exit_code(self, pid: int, wait: float) -> int | None:
        """``pid``'s exit code once relayed (waiting up to ``wait`` s); -SIGKILL if the server died."""
        deadline = time.monotonic() + wait
        while pid not in self.exits:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            message, _ = self._next(left)
            if message is None and self._gone:
                return -signal.SIGKILL  # the server died: its ranks were killed with it (PDEATHSIG)
        return self.exits.pop(pid)

    def _next(self, timeout: float) -> tuple[dict[str, Any] | None, list[int]]:
        """The next message (exit codes are kept in ``exits``), or (None, []) on timeout or end."""
        if self._gone or not select.select([self.sock], [], [], max(timeout, 0))[0]:
            return None, []
        message, fds = recv_message(self.sock)
        if message is None:
            self._gone = True
        elif message["op"] == "exit":
            self.exits[int(message["pid"])] = int(message["code"])
            self.running.discard(int(message["pid"]))
        return message, fds

    def close(self) -> None:
        """End the server (its ranks die with it) and reap it."""
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
        self._gone = True


def _socketpair() -> tuple[socket.socket, socket.socket]:
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for end in pair:
        end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER)
        end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER)
    return pair


def fork_from_kernel() -> ForkServer:
    """Fork the server from this (fork-safe) process; it shares every page the kernel has now."""
    kernel_end, server_end = _socketpair()
    parent = os.getpid()
    gc.freeze()  # the server's collector must not touch (and so copy) the kernel's objects
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded kernel: see fork.py
            pid = os.fork()
        if pid == 0:
            kernel_end.close()
            serve(server_end, parent, WARM_MODULES[-1:])
    finally:
        gc.unfreeze()
    server_end.close()
    return ForkServer(kernel_end, pid, "forked", frozenset(_warm_names()), frozenset(sys.modules))


def exec_fresh() -> ForkServer:
    """Start the server as a fresh interpreter importing the kernel's heavy modules by name."""
    kernel_end, server_end = _socketpair()
    modules = [name for name in WARM_MODULES if name in sys.modules or name.startswith("nbaccel.")]
    env = dict(os.environ)
    # The kernel may import from places only its sys.path knows (the notebook's folder).
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if isinstance(p, str) and p)
    try:
        pid = os.posix_spawn(
            sys.executable,
            [sys.executable, "-m", "nbaccel.rank.server_loop", "3", str(os.getpid()), *modules],
            env,
            file_actions=[(os.POSIX_SPAWN_DUP2, server_end.fileno(), 3)],
            setpgroup=0,  # out of the kernel's group: Jupyter's interrupt is not for it
        )
    finally:
        server_end.close()
    return ForkServer(kernel_end, pid, "exec'd", frozenset(modules), frozenset(sys.modules))


class ServedRankProcess(RankProcess):
    """A rank forked by the server: waited on through the pidfd the server sent, its exit code
    relayed (the kernel cannot ``waitpid`` a process that is not its child)."""

    def __init__(self, rank: int, pid: int, pidfd: int, server: ForkServer) -> None:
        self.rank = rank
        self.pid = pid
        self.returncode: int | None = None
        self.signals_sent: list[int] = []
        self.pidfd: int | None = pidfd
        self.server = server

    def poll(self) -> int | None:
        if self.returncode is None:
            ended = self.pidfd is None or bool(select.select([self.pidfd], [], [], 0)[0])
            code = self.server.exit_code(self.pid, _EXIT_WAIT if ended else 0.0)
            if code is None and ended:
                code = -signal.SIGKILL if self.signals_sent else 255  # ended, its code never came
            self.returncode = code
        return self.returncode


class ServerStarter:
    """Starts each rank by asking the fork server to fork it.

    Example::

        pid = ServerStarter(fork_server()).start(job, rank=0, env=env, ends=ends, close_fds=[])
    """

    start_method = "forkserver"

    def __init__(self, server: ForkServer) -> None:
        from nbaccel.launch.starters.spawn import PickledJobs

        self.server = server  # the kernel's server when this starter was made; each start asks anew
        self.jobs = PickledJobs()
        self._job_fd: tuple[bytes, int] | None = None
        self._started: dict[int, tuple[int, ForkServer]] = {}

    def start(self, job: Job, rank: int, env: dict[str, str], ends: ChildEnds, close_fds: list[int]) -> int:
        request = {
            "op": "start",
            "rank": rank,
            "env": env,
            "commands": ends.commands is not None,
            "shared": ends.shared is not None,
            "modules": _warm_names(),
            "imports": imported_since(self.server.kernel_had),
            "environ": dict(os.environ),
            "path": list(sys.path),
            "cwd": os.getcwd(),
        }
        fds = [ends.stdout, ends.stderr, ends.channel, self._job_memfd(job)]
        fds += [fd for fd in (ends.commands, ends.shared) if fd is not None]
        request["attached"] = self.jobs.attached.tag
        fds += self.jobs.attached.fds
        if self.server is not _server or not self.server.alive():
            self.server = fork_server()  # a pool outlives servers: restarted or forked again since
            request["imports"] = imported_since(self.server.kernel_had)
        pid, pidfd = self.server.start_rank(request, fds)
        self._started[pid] = (pidfd, self.server)
        return pid

    def process(self, rank: int, pid: int) -> RankProcess:
        pidfd, server = self._started.pop(pid)
        return ServedRankProcess(rank, pid, pidfd, server)

    def _job_memfd(self, job: Job) -> int:
        """One memfd per launch holding the pickled job (no file anywhere; freed with its last fd)."""
        payload = self.jobs.payload(job)
        if self._job_fd is None or self._job_fd[0] is not payload:
            if self._job_fd is not None:
                os.close(self._job_fd[1])
            fd = os.memfd_create("nbaccel-job", os.MFD_CLOEXEC)
            _write_all(fd, payload)
            self._job_fd = (payload, fd)
        return self._job_fd[1]

    def release(self) -> None:
        """Every rank of the launch has the job: close its memfd (the ranks hold their own)."""
        if self._job_fd is not None:
            os.close(self._job_fd[1])
            self._job_fd = None
        self.jobs.release()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def imported_since(kernel_had: frozenset[str]) -> list[str]:
    """Modules this kernel imported after its server started, in import order, that a rank can
    import by name: a forked rank would have them (a module next to the notebook, a plugin imported
    only to register itself), so the server's ranks import them before the function runs.

    Skipped: nbaccel's own (the rank imports what it needs), and modules made at run time, whose
    spec does not name them (``__main__``, aliases such as ``os.path``, modules without a spec).

    >>> import sys, types
    >>> sys.modules["made_at_run_time"] = types.ModuleType("made_at_run_time")
    >>> "made_at_run_time" in imported_since(frozenset())
    False
    """
    names = []
    for name, module in list(sys.modules.items()):
        if name in kernel_had or name == "nbaccel" or name.startswith("nbaccel."):
            continue
        spec = getattr(module, "__spec__", None)
        if spec is not None and getattr(spec, "name", None) == name:
            names.append(name)
    return names


def _warm_names() -> list[str]:
    return [name for name in WARM_MODULES if name in sys.modules and not name.startswith("nbaccel.")]


# -- the kernel's one server -------------------------------------------------------------------

_server: ForkServer | None = None


def supported() -> bool:
    """Whether this system can run the server (Linux pidfds, fd passing)."""
    return hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")


def mode() -> str:
    value = os.environ.get(MODE_VARIABLE, "eager").strip().lower()
    return value if value in ("eager", "lazy", "off") else "eager"


def start_early() -> None:
    """At ``import nbaccel`` in a kernel / ``%load_ext nbaccel``: fork the server now, while the
    kernel is fork-safe (later it may not be). Does nothing when it runs, is off, or unsafe now."""
    global _server
    if _server is not None or mode() != "eager" or not supported() or fork_hazards():
        return
    _server = fork_from_kernel()
    atexit.register(shutdown)
    _watch_cells()


def refresh(memory: bool = True) -> None:
    """Fork the server again when the kernel, still fork-safe, has gained heavy modules (torch)
    since (the new one shares them instead of importing its own copy: 100+ MiB), or when the
    server's own memory grew past 24 MiB (copy-on-write). Only while no rank of the old one runs.

    Called after each cell and (``memory=False``) before each forked launch. The modules are a
    set compared; the memory is looked at after a cell at most every 30 s: reading the
    ``smaps_rollup`` of a process that maps torch walks all its page tables (2-9 ms here, which
    every cell and every launch used to pay), and the server's memory only grows as the kernel
    writes to the pages they share."""
    global _server
    server = _server
    if server is None or server.how != "forked" or server.running:
        return
    if set(_warm_names()) <= server.modules and not (memory and _grew(server.pid)):
        return
    if fork_hazards() or not server.alive():
        return
    server.close()
    _server = fork_from_kernel()


_MEMORY_EVERY = 30.0  # seconds between looks at the server's own memory
_memory_looked_at = [float("-inf")]


def _grew(pid: int) -> bool:
    """The server's own memory passed ``_REFRESH_ABOVE`` (looked at most every ``_MEMORY_EVERY`` s)."""
    now = time.monotonic()
    if now - _memory_looked_at[0] < _MEMORY_EVERY:
        return False
    _memory_looked_at[0] = now
    return own_memory(pid) >= _REFRESH_ABOVE


def own_memory(pid: int) -> int:
    """Bytes only ``pid`` holds (USS: private pages). Pages it shared with the kernel become its
    own as the kernel writes to them (its garbage collector touches every object's header)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as rollup:
            return sum(int(line.split()[1]) * 1024 for line in rollup if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except OSError:
        return 0


def _after_cell(*_: Any) -> None:
    try:
        refresh()
    except OSError:  # fork failed (out of memory, pid limit): the next launch starts one
        pass


def _watch_cells() -> None:
    ipython_module = sys.modules.get("IPython")
    shell = ipython_module.get_ipython() if ipython_module is not None else None
    if shell is not None and _after_cell not in shell.events.callbacks.get("post_run_cell", []):
        shell.events.register("post_run_cell", _after_cell)


def fork_server() -> ForkServer:
    """The kernel's running server: started (or restarted, saying so) when there is none."""
    global _server
    if _server is not None and _server.alive():
        return _server
    restarted = _server is not None
    if _server is not None:
        _server.close()
    _server = fork_from_kernel() if not fork_hazards() else exec_fresh()
    atexit.register(shutdown)
    if restarted:
        say(f"the fork server had ended; started a new one ({_server.how}, pid {_server.pid})")
    return _server


def running_server() -> ForkServer | None:
    """The server if one was started (alive or not); for tests and status."""
    return _server


def shutdown() -> None:
    """End the server (at kernel exit, and in tests)."""
    global _server
    server, _server = _server, None
    if server is not None:
        server.close()
