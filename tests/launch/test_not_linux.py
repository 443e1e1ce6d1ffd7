"""On macOS and Windows ``import nbaccel`` works, the state API works in one process, and a launch
says in one line that nbaccel's launcher needs Linux, with nothing started.

The platform is stubbed in a fresh interpreter: ``sys.platform`` and the ``os`` / ``socket``
functions the system lacks (macOS: memfd, pidfd; Windows: fork too, and POSIX-only modules), after
the standard library and torch were imported with the real platform (they read it at import).
One test imports an internal (launch.platform) to check what it finds missing on Linux.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import os, socket, sys
    import sysconfig, urllib.request, torch, torch.distributed  # with the real platform: they read it at import
    sysconfig.get_config_vars()
    platform = sys.argv[1]
    sys.platform = platform
    lacking = ("memfd_create", "pidfd_open") + (("fork", "posix_spawn", "register_at_fork") if platform == "win32" else ())
    for name in lacking:
        if hasattr(os, name):
            delattr(os, name)
    if platform == "win32":
        del socket.send_fds
        for module in ("fcntl", "resource", "termios", "pwd", "grp"):
            sys.modules[module] = None  # importing it raises ImportError, as on Windows
    import nbaccel
    from nbaccel import AcceleratorState, GradientState, PartialState
    for name, call in (("launch", lambda: nbaccel.notebook_launcher(lambda: 1, num_processes=2)), ("workers", lambda: nbaccel.start_workers(2)),
                       ("plan", lambda: nbaccel.plan(num_processes=2))):
        try:
            call()
            print(name, "STARTED")
        except nbaccel.PreflightError as error:
            print(name, "REFUSED", str(error))
    state = PartialState()
    print("state", state.num_processes, state.process_index, state.device, state.is_main_process, AcceleratorState().num_processes, GradientState().num_steps)
    """
)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("platform", ["darwin", "win32"])
def test_nbaccel_imports_and_a_launch_says_it_needs_linux(platform: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, platform], capture_output=True, text=True, timeout=100, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    lacking = f"Linux (this is {platform}), " + ("os.fork, os.memfd_create" if platform == "win32" else "os.memfd_create")
    for what, name in (("launch", "notebook_launcher"), ("workers", "start_workers"), ("plan", "notebook_launcher")):
        [line] = [line for line in lines if line.startswith(f"{what} ")]
        assert line == (
            f"{what} REFUSED {name} needs Linux (fork, memfd, pidfd), and this system lacks {lacking}; PartialState and the state API work here "
            "in one process: run launches on Linux (WSL 2 on Windows, a Linux VM or container on macOS)."
        )
    assert lines[-1] == "state 1 0 cpu True 1 1"


def test_linux_lacks_nothing() -> None:
    from nbaccel.launch.platform import missing

    assert missing() == []
