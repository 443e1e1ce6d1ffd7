"""A private JupyterLab server for browser tests: loopback only, a token, a temporary root.

Example::

    with jupyterlab(root) as lab:
        page.goto(lab.url("lab/tree/demo.ipynb"))
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--disable-sync",
]


@dataclass
class Lab:
    port: int
    token: str
    root: Path
    process: subprocess.Popen[bytes]
    log: Path

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def api(self, method: str, path: str) -> object:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def jupyterlab(root: Path, env: dict[str, str] | None = None, timeout: float = 60.0, app: str = "jupyterlab", args: tuple[str, ...] = ()) -> Iterator[Lab]:
    """Start ``jupyter lab`` on 127.0.0.1 serving ``root``; stop it and its kernels afterwards.

    ``app="nbclassic"`` starts the classic Notebook instead (the same server, its own pages);
    ``args`` are more server options.
    """
    port, token = _free_port(), secrets.token_hex(16)
    home = root / ".home"
    home.mkdir(exist_ok=True)
    server_env = dict(os.environ)
    server_env.update(
        {
            "JUPYTERLAB_SETTINGS_DIR": str(home / "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": str(home / "workspaces"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "IPYTHONDIR": str(home / "ipython"),
        }
    )
    server_env.update(env or {})
    log = root / ".home" / "jupyterlab.log"
    command = [
        sys.executable,
        "-m",
        app,
        "--no-browser",
        "--allow-root",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.shutdown_no_activity_timeout=0",
        *args,
    ]
    if app == "jupyterlab":
        command += ["--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "wb") as log_file:
        process = subprocess.Popen(command, env=server_env, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    lab = Lab(port, token, root, process, log)
    try:
        _wait_ready(lab, timeout)
        yield lab
    finally:
        _stop(lab)


def _wait_ready(lab: Lab, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if lab.process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {lab.process.returncode}:\n{lab.log.read_text()[-3000:]}")
        try:
            lab.api("GET", "status")
            return
        except OSError:
            time.sleep(0.2)
    raise TimeoutError(f"jupyter lab did not answer within {timeout} s:\n{lab.log.read_text()[-3000:]}")


def _stop(lab: Lab) -> None:
    """Shut kernels down through the API (they are the server's children), then the server."""
    with contextlib.suppress(Exception):
        for kernel in lab.api("GET", "kernels") or []:  # type: ignore[union-attr]
            lab.api("DELETE", f"kernels/{kernel['id']}")
    if lab.process.poll() is None:
        lab.process.send_signal(signal.SIGTERM)  # the server's own handler stops its kernels too
        try:
            lab.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(lab.process.pid, signal.SIGKILL)
            lab.process.wait(timeout=5)
