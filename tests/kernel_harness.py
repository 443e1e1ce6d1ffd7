"""A real ipykernel driven through jupyter_client, as a notebook frontend drives it.

Example::

    with running_kernel() as kernel:
        reply = kernel.execute("print(1 + 1)")
        assert reply.stdout == "2\\n"
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psutil
from jupyter_client.manager import KernelManager

from nbaccel.testing import scaled


@dataclass
class Execution:
    """Everything one execute_request produced on iopub, plus its reply."""

    reply: dict[str, Any]
    messages: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    prompts: list[str] = field(default_factory=list)  # every input_request's prompt, in order

    @property
    def status(self) -> str:
        return self.reply["content"]["status"]

    def stream(self, name: str) -> str:
        return "".join(m["content"]["text"] for m in self.messages if m["msg_type"] == "stream" and m["content"]["name"] == name)

    @property
    def stdout(self) -> str:
        return self.stream("stdout")

    @property
    def stderr(self) -> str:
        return self.stream("stderr")

    @property
    def shown(self) -> str:
        """What a person reads in the cell: stdout and each display's text/plain, in order (a table nbaccel displays shows both)."""
        parts = []
        for m in self.messages:
            if m["msg_type"] == "stream" and m["content"]["name"] == "stdout":
                parts.append(m["content"]["text"])
            elif m["msg_type"] == "display_data" and "text/plain" in m["content"]["data"]:
                parts.append(m["content"]["data"]["text/plain"].rstrip("\n") + "\n")
        return "".join(parts)

    @property
    def error(self) -> dict[str, Any] | None:
        return next((m["content"] for m in self.messages if m["msg_type"] == "error"), None)

    def of_type(self, *types: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["msg_type"] in types]


class Kernel:
    def __init__(self, manager: KernelManager) -> None:
        self.manager = manager
        self.client = manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=scaled(60))

    @property
    def pid(self) -> int:
        return self.manager.provisioner.process.pid  # type: ignore[union-attr]

    def children(self) -> list[int]:
        """Pids of every process the kernel started that still exists (ranks, workers)."""
        return [p.pid for p in psutil.Process(self.pid).children(recursive=True)]

    def execute(
        self,
        code: str,
        timeout: float = 60.0,
        interrupt_after: float | None = None,
        interrupt_on: str | Callable[[str], bool] | None = None,
        answers: Answers | None = None,
    ) -> Execution:
        """Run ``code``; collect iopub until the kernel is idle again.

        ``interrupt_on``: interrupt the kernel (as the notebook's stop button does) as soon as the
        cell's output holds this text (or this test of the output so far holds), e.g. a rank's
        first line: an event, not a guess of how long starting takes. ``interrupt_after``: interrupt after that many seconds
        (prefer ``interrupt_on``). ``timeout`` is scaled by ``nbaccel.testing.scaled``.

        ``answers``: the cell runs with stdin allowed, as JupyterLab runs it, and each
        ``input_request`` is answered (on the stdin channel) with the next line of the list, or
        with what ``answers(prompt)`` returns; None there leaves the prompt unanswered (the
        test then interrupts). Without ``answers`` the cell runs as nbclient runs it: no stdin.
        """
        started = time.monotonic()
        msg_id = self.client.execute(code, store_history=True, allow_stdin=answers is not None)
        prompts: list[str] = []
        answer = _answerer(answers)
        messages: list[dict[str, Any]] = []
        output = ""
        interrupted = False
        deadline = started + scaled(timeout)
        idle = False
        while not idle:
            if interrupt_after is not None and not interrupted and time.monotonic() - started >= interrupt_after:
                self.manager.interrupt_kernel()
                interrupted = True
            if answers is not None:
                self._answer_stdin(answer, prompts)
                if interrupt_on is not None and not interrupted and _holds(output + "".join(prompts), interrupt_on):
                    self.manager.interrupt_kernel()
                    interrupted = True
            wait = 0.05 if (interrupt_after is not None and not interrupted) or answers is not None else max(0.01, deadline - time.monotonic())
            try:
                msg = self.client.get_iopub_msg(timeout=wait)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"kernel did not finish within {scaled(timeout):.0f} s: {code[:200]!r}") from None
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
            else:
                messages.append(msg)
                output += msg["content"]["text"] if msg["msg_type"] == "stream" else ""
                if interrupt_on is not None and not interrupted and _holds(output + "".join(prompts), interrupt_on):
                    self.manager.interrupt_kernel()
                    interrupted = True
        reply = self._reply_to(msg_id, deadline)
        return Execution(reply=reply, messages=messages, elapsed=time.monotonic() - started, prompts=prompts)

    def _answer_stdin(self, answer: Callable[[str], str | None], prompts: list[str]) -> None:
        while True:
            try:
                msg = self.client.get_stdin_msg(timeout=0)
            except queue.Empty:
                return
            if msg["msg_type"] != "input_request":
                continue
            prompt = msg["content"]["prompt"]
            prompts.append(prompt)
            line = answer(prompt)
            if line is not None:
                self.client.input(line)

    def _reply_to(self, msg_id: str, deadline: float) -> dict[str, Any]:
        # Skip shell replies to other requests: under load `wait_for_ready` sends kernel_info
        # more than once, and a stale reply would otherwise be taken as this cell's.
        while True:
            reply = self.client.get_shell_msg(timeout=max(1.0, deadline - time.monotonic()))
            if reply["parent_header"].get("msg_id") == msg_id:
                return reply

    def shutdown(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=False)


@contextlib.contextmanager
def running_kernel(env: dict[str, str] | None = None, cwd: str | None = None) -> Iterator[Kernel]:
    """A fresh python3 kernel of this interpreter (in ``cwd``, default this process's), shut down (and reaped) afterwards."""
    kernel_env = dict(os.environ)
    # A kernel forks nbaccel's fork server at `import nbaccel`; in a test that imports nbaccel
    # it would count as a process the test left behind. Tests of the server ask for "eager".
    kernel_env.setdefault("NBACCEL_FORK_SERVER", "lazy")
    kernel_env.update(env or {})
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(
        extra_arguments=[],
        env=kernel_env,
        **({"cwd": cwd} if cwd is not None else {}),
    )
    kernel = None
    try:
        kernel = Kernel(manager)
        yield kernel
    finally:
        if kernel is not None:
            kernel.shutdown()
        else:
            manager.shutdown_kernel(now=True)


Answers = list[str] | Callable[[str], "str | None"]


def _answerer(answers: Answers | None) -> Callable[[str], str | None]:
    if answers is None or callable(answers):
        return answers or (lambda prompt: None)
    lines = list(answers)

    def next_line(prompt: str) -> str | None:
        if not lines:
            raise AssertionError(f"an input_request came with no answer left to give: {prompt!r}")
        return lines.pop(0)

    return next_line


def _holds(output: str, expected: str | Callable[[str], bool]) -> bool:
    return expected in output if isinstance(expected, str) else expected(output)


def wait_until(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``condition`` until it holds; the seconds that took. ``seconds`` is scaled.

    Raises AssertionError naming ``what`` when it still does not hold after ``scaled(seconds)``.
    """
    started = time.monotonic()
    limit = scaled(seconds)
    while not condition():
        if time.monotonic() - started > limit:
            raise AssertionError(f"{what}: still not so after {limit:.1f} s")
        time.sleep(0.02)
    return time.monotonic() - started


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped does not count)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def python3_kernel_uses_this_interpreter() -> bool:
    from jupyter_client.kernelspec import KernelSpecManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    return spec.argv[0] in (sys.executable, "python", "python3") or os.path.realpath(spec.argv[0]) == os.path.realpath(sys.executable)
