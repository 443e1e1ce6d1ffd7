"""What every way of starting agents gives the cluster: a handle it watches while waiting and stops at close.

A start brings ``expected`` agents that join with ``--started-by LABEL``; the cluster counts
joined nodes per label. ``failure()`` says why no (more) agent can come from it (the starting command
process ended first: its exit code and the tail of its output); ``progress()`` where it stands
while the cluster waits (a Slurm job's queue state). ``ProcessStart`` is the start of one local
process (ssh, srun, kubectl) that nbaccel started and may therefore signal.

Example::

    start = ProcessStart("ssh node1", ["ssh", "node1", "nbaccel-agent", ...], token=secret_hex)
    start.failure()      # None while ssh runs; "ssh node1 ended with exit code 127 ..." after
    start.stop(grace=2.0)
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path

_TAIL_LINES = 6
_TAIL_BYTES = 4096


def default_agent() -> list[str]:
    """``nbaccel-agent`` of the kernel's own Python environment (right for a shared filesystem), else PATH's.

    Example:
        >>> default_agent()[-1].endswith("nbaccel-agent")
        True
    """
    beside = Path(sys.executable).with_name("nbaccel-agent")
    return [str(beside)] if beside.exists() else ["nbaccel-agent"]


def agent_argv(agent: str | list[str] | None, address: str, label: str, nproc_per_node: int | None, token: str, order: int | None = None) -> list[str]:
    """The agent's command line: ``token`` is ``"stdin"`` or ``"file:PATH"``; the secret itself never appears.

    Example:
        >>> agent_argv("/env/bin/nbaccel-agent", "10.0.0.1:29400", "ssh node1", 2, "stdin")
        ['/env/bin/nbaccel-agent', '10.0.0.1:29400', '--token-stdin', '--started-by', 'ssh node1', '--nproc-per-node', '2']
    """
    words = default_agent() if agent is None else (shlex.split(agent) if isinstance(agent, str) else list(agent))
    if not words:
        raise ValueError(f"agent={agent!r} is empty; give the path of nbaccel-agent on the nodes (or leave it out).")
    argv = [*words, address, *(["--token-stdin"] if token == "stdin" else ["--token-file", token.removeprefix("file:")])]
    argv += ["--started-by", label, *([] if order is None else ["--order", str(order)])]
    return argv if nproc_per_node is None else [*argv, "--nproc-per-node", str(nproc_per_node)]


def output_tail(data: bytes) -> str:
    """The last lines of what a starting command printed, one string ("" when it printed nothing).

    Example:
        >>> output_tail(b"a\\nb\\nbash: nbaccel-agent: command not found\\n")
        'a; b; bash: nbaccel-agent: command not found'
    """
    lines = [line.strip() for line in data[-_TAIL_BYTES:].decode(errors="replace").splitlines() if line.strip()]
    return "; ".join(lines[-_TAIL_LINES:])


class AgentStart(ABC):
    """Agents on their way to the cluster, started one way."""

    label: str
    expected: int
    started_at: float = 0.0  # time.monotonic() when it began: only agents joined since count for it

    @abstractmethod
    def failure(self) -> str | None:
        """Why no (more) agent will come from this start, or None while it may still bring them."""

    def progress(self) -> str | None:
        """Where the start stands while the cluster waits for it (shown when it changes)."""
        return None

    @abstractmethod
    def stop(self, grace: float) -> None:
        """After the cluster told its agents to exit: give them ``grace`` seconds, then end what is left."""


class ProcessStart(AgentStart):
    """One local starting command's process (ssh, srun, kubectl exec, ...); its output kept for the error."""

    def __init__(self, label: str, argv: list[str], expected: int = 1, stdin_line: str | None = None, env: dict[str, str] | None = None) -> None:
        self.label, self.argv, self.expected = label, argv, expected
        self.started_at = time.monotonic()
        self._output = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the process's life; closed by stop()
        try:
            self.process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if stdin_line is not None else subprocess.DEVNULL,
                stdout=self._output,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # the notebook's interrupt is for its cell, not for ssh
            )
        except OSError as exc:
            self._output.close()
            raise OSError(exc.errno, f"cannot run {argv[0]!r} to start agents ({exc.strerror}); is it installed and on the kernel's PATH?") from None
        if stdin_line is not None:
            self._send_line(stdin_line)

    def _send_line(self, line: str) -> None:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line.encode() + b"\n")
            self.process.stdin.close()
        except OSError:
            pass  # it ended already: failure() says why

    def output(self) -> str:
        self._output.seek(0)
        return output_tail(self._output.read())

    def failure(self) -> str | None:
        code = self.process.poll()
        if code is None:
            return None
        said = self.output()
        return f"{self.label} ended with exit code {code} before its agent joined" + (f": {said}" if said else " (it printed nothing)")

    def stop(self, grace: float) -> None:
        try:
            self.process.wait(grace)
        except subprocess.TimeoutExpired:
            self.process.terminate()  # our own child: ssh closes the session, srun ends its step
            try:
                self.process.wait(3.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(3.0)
        self._output.close()

    def __repr__(self) -> str:
        state = "running" if self.process.poll() is None else f"ended ({self.process.returncode})"
        return f"<{type(self).__name__} {self.label}: pid {self.process.pid}, {state}>"


def secret_line(token_file: str) -> str:
    """The token file's one line, for a starting command's stdin."""
    with open(token_file, encoding="ascii") as handle:
        return handle.read().strip()


def environment(extra: dict[str, str] | None) -> dict[str, str] | None:
    """The starting command's environment: the kernel's, plus ``extra``."""
    return None if not extra else {**os.environ, **extra}
