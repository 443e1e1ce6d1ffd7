"""The fork server's own loop: fork a rank on each request, reap it, relay its exit code.

The server is a small process started by the kernel (forked from it while it was fork-safe, or
exec'd fresh with ``python -m nbaccel.rank.server_loop``) that never touches CUDA. It waits on one
AF_UNIX SOCK_SEQPACKET socket (its end of a socketpair with the kernel) and on one pidfd per rank
it forked; nothing else wakes it, so it costs no CPU while idle. A request carries the rank's
stdout, stderr, event-channel (and command) fds and a memfd holding the pickled job, passed with
SCM_RIGHTS; the server forks, sends back the rank's pid with a pidfd for it, and later its exit
code. It dies with the kernel (``PR_SET_PDEATHSIG``, and end of file on the socket) and takes its
ranks with it (theirs is set on the server).

Messages are pickled dicts on a socketpair private to the kernel and its own child (like the
event pipes: nothing here came from a network; ``nbaccel.wire.fork_server_messages`` sends and reads them):

- kernel to server ``{"op": "start", "rank", "env", "commands", "shared", "modules", "imports",
  "environ", "path", "cwd"}`` + fds ``[stdout, stderr, channel, job, (commands), (shared), memfds of the job...]``;
- server to kernel ``{"op": "started", "pid"}`` + ``[pidfd]``, or ``{"op": "failed", "error"}``;
- server to kernel ``{"op": "exit", "pid", "code"}`` when a rank ended.

Example (what the kernel does, nbaccel.launch.starters.fork_server)::

    kernel_end, server_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if os.fork() == 0:
        serve(server_end, parent_pid=kernel_pid)  # never returns
"""

from __future__ import annotations

import gc
import importlib
import os
import selectors
import signal
import socket
import sys
from typing import Any, NoReturn

from nbaccel.rank import process_title
from nbaccel.wire.fork_server_messages import recv_message, send_message

_PR_SET_PDEATHSIG = 1
_EXIT_PARENT_GONE = 70


def serve(sock: socket.socket, parent_pid: int, modules: tuple[str, ...] = ()) -> NoReturn:
    """Run the server until the kernel goes (importing ``modules`` first); never returns."""
    code = 0
    try:
        _become_server(parent_pid)
        _warm(modules)
        gc.freeze()
        _Server(sock).run()
    except BaseException:  # noqa: BLE001 - the server must never fall back into the kernel's stack
        code = 1
    finally:
        os._exit(code)


def _become_server(parent_pid: int) -> None:
    try:
        os.setpgid(0, 0)  # its own pgid: Jupyter's interrupt of the kernel's pgid must not reach it
    except OSError:
        pass
    _die_with(parent_pid)
    process_title.name_fork_server(parent_pid)  # not another copy of the kernel in ps and top
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP", "SIGCHLD", "SIGUSR1", "SIGUSR2"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
    gc.freeze()  # everything so far stays shared with the kernel (or between ranks)


def _die_with(parent_pid: int) -> None:
    from nbaccel.rank.bootstrap import _prctl

    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the kernel died before prctl took effect
        os._exit(_EXIT_PARENT_GONE)


class _Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, int] = {}  # pidfd -> pid

    def run(self) -> None:
        self.selector.register(self.sock, selectors.EVENT_READ)
        while True:
            for key, _ in self.selector.select():
                if key.fileobj is self.sock:
                    if not self._on_request():
                        self._kill_children()
                        return
                else:
                    self._on_exit(int(key.fd))

    def _on_request(self) -> bool:
        message, fds = recv_message(self.sock)
        if message is None:
            return False
        try:
            self._start(message, fds)
        except Exception as exc:  # noqa: BLE001 - the kernel is told; the server stays up
            send_message(self.sock, {"op": "failed", "error": f"{type(exc).__name__}: {exc}"})
        finally:
            for fd in fds:
                os.close(fd)
        return True

    def _start(self, message: dict[str, Any], fds: list[int]) -> None:
        _warm(message.get("modules", ()))
        gc.freeze()  # what warming allocated too: a rank's collector never touches these pages
        pid = os.fork()
        if pid == 0:
            self._become_rank(message, fds)
        try:
            os.setpgid(pid, pid)
        except OSError:
            pass
        pidfd = os.pidfd_open(pid)
        self.children[pidfd] = pid
        self.selector.register(pidfd, selectors.EVENT_READ)
        send_message(self.sock, {"op": "started", "pid": pid}, [pidfd])

    def _become_rank(self, message: dict[str, Any], fds: list[int]) -> NoReturn:
        from nbaccel.rank.bootstrap import run_rank
        from nbaccel.wire.job import ChildEnds

        server_pid = os.getppid()
        stdout, stderr, channel, job_fd, *rest = fds
        commands = rest.pop(0) if message["commands"] else None
        shared = rest.pop(0) if message.get("shared") else None
        from nbaccel.wire import shm

        shm.expect(message["attached"], rest)  # the memfds of the job's big arguments
        try:
            job = _read_all(job_fd)
            os.close(job_fd)
            mine = [self.sock.fileno(), self.selector.fileno(), *self.children]
            _take_kernel_context(message)
            _import_by_name(message.get("imports", ()))
        except BaseException:  # noqa: BLE001 - never return into the server's loop
            os._exit(_EXIT_PARENT_GONE)
        run_rank(job, message["rank"], message["env"], ChildEnds(stdout, stderr, channel, commands, shared), mine, server_pid)

    def _on_exit(self, pidfd: int) -> None:
        pid = self.children.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
            code = os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            code = 255
        try:
            send_message(self.sock, {"op": "exit", "pid": pid, "code": code})
        except OSError:  # the kernel is gone: the loop sees end of file next
            pass

    def _kill_children(self) -> None:
        for pid in self.children.values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def _take_kernel_context(message: dict[str, Any]) -> None:
    """The kernel's environment, sys.path and folder as they are now, not as at the server's start."""
    os.environ.clear()
    os.environ.update(message["environ"])
    sys.path[:] = message["path"]
    try:
        os.chdir(message["cwd"])
    except OSError:  # the folder was removed meanwhile: stay where the server is
        pass


def _import_by_name(names: Any) -> None:
    """In a rank: what the kernel imported since the server started (``imports``), by name, in the
    kernel's order, so the rank sees the kernel's modules as a forked one would. Imported here, in
    the rank, never in the server: a module may have touched CUDA on import, and the server must
    stay fork-safe. One that fails here is left out (the function meets the error if it needs it)."""
    for name in names:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # noqa: BLE001 - an import that raises anything (SystemExit too) must not stop the rank
                continue


def _warm(modules: Any) -> None:
    """Import what the kernel has and the server lacks (allow-listed by the kernel: torch, numpy)."""
    for name in modules:
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - warming is an optimisation: the rank imports what it needs
                continue


def _read_all(fd: int) -> bytes:
    size = os.fstat(fd).st_size
    chunks, offset = [], 0
    while offset < size:
        chunk = os.pread(fd, size - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def main() -> None:
    """``python -m nbaccel.rank.server_loop FD PARENT_PID [MODULE ...]``: the exec'd server."""
    fd, parent_pid, *modules = sys.argv[1:]
    serve(socket.socket(fileno=int(fd)), int(parent_pid), tuple(modules))


if __name__ == "__main__":
    main()
