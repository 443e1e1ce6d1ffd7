"""Start node agents for tests: real ``nbaccel-agent`` processes (``python -m nbaccel.agent``) on loopback.

Example::

    with Cluster("127.0.0.1:0") as cluster:
        agents = start_agents(cluster, nodes=2, nproc=2)
        try:
            cluster.wait(nodes=2, timeout=60)
        finally:
            stop_agents(agents)
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import psutil

from nbaccel import Cluster


def agent_argv(address: str, token_file: str | None, nproc: int | None = 2) -> list[str]:
    """``nbaccel-agent`` as this interpreter runs it (the console script needs an install)."""
    argv = [sys.executable, "-m", "nbaccel.agent", address]
    argv += [] if token_file is None else ["--token-file", token_file]
    return argv if nproc is None else [*argv, "--nproc-per-node", str(nproc)]


def start_agents(cluster: Cluster, nodes: int = 2, nproc: int = 2, **popen: Any) -> list[subprocess.Popen[str]]:
    return [subprocess.Popen(agent_argv(cluster.address, cluster.token_file, nproc), text=True, **popen) for _ in range(nodes)]


def stop_agents(agents: list[subprocess.Popen[str]], timeout: float = 10.0) -> None:
    """Wait for agents to exit (they do when their cluster closes); kill what lingers."""
    deadline = time.monotonic() + timeout
    for agent in agents:
        try:
            agent.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(5)


def descendants(pid: int) -> list[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children(recursive=True) if c.status() != psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []


def wait_until(condition: Any, timeout: float, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return bool(condition())


class CreatesFile:
    """Unpickling this creates ``path``: proof that a payload was (or was not) unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (_touch, (self.path,))


def _touch(path: str) -> str:
    with open(path, "w") as handle:
        handle.write("unpickled")
    return path


def poison(path: str) -> bytes:
    """A pickle that creates ``path`` when loaded, made without importing this test module there."""
    return pickle.dumps(CreatesFileBuiltin(path))


class CreatesFileBuiltin:
    """Like CreatesFile, but only needs builtins to act on load (``open(path, 'w')``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


def interrupt_main_thread() -> None:
    """What Jupyter's interrupt does to a kernel: a real SIGINT, delivered to the main thread
    (``_thread.interrupt_main`` would not wake a thread blocked in select)."""
    signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)


def open_fds(pid: int | None = None) -> int:
    return len(os.listdir(f"/proc/{pid or os.getpid()}/fd"))
