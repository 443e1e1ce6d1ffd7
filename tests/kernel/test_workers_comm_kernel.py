"""The ``nbaccel.workers`` comm in a real ipykernel, this test acting as the extension's frontend:
pushes on start, cell start and end, crash and stop; restart/stop requests; silence without it."""

from __future__ import annotations

import json
import os
import queue
import signal
import time
import uuid
from collections.abc import Iterator
from importlib import resources
from typing import Any

import jsonschema
import psutil
import pytest

from tests.extension_types import strict
from tests.kernel_harness import Execution, Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]
TARGET = "nbaccel.workers"
# What the kernel sends must be in the protocol's schema, as protocol.ts declares it (tests/test_extension_types.py).
PROTOCOL = strict(json.loads(resources.files("nbaccel.notebook").joinpath("workers_protocol.schema.json").read_text()))


def _checked(data: dict[str, Any]) -> dict[str, Any]:
    jsonschema.validate(data, PROTOCOL)
    return data


@pytest.fixture(scope="module")
def kernel_setup() -> str:
    return "%load_ext nbaccel\nimport torch"


@pytest.fixture
def clean(kernel: Kernel) -> Iterator[Kernel]:
    yield kernel
    kernel.execute("%distributed stop")
    assert psutil.Process(kernel.pid).children() == []


class Frontend:
    """One comm of the extension: open it, send requests, read what the kernel answers."""

    def __init__(self, kernel: Kernel) -> None:
        self.kernel = kernel
        self.comm_id = uuid.uuid4().hex

    def open(self) -> list[dict[str, Any]]:
        return self._request("comm_open", {"comm_id": self.comm_id, "target_name": TARGET, "data": {"request": "status"}})

    def send(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        return self._request("comm_msg", {"comm_id": self.comm_id, "data": data})

    def pushes(self, run: Execution) -> list[dict[str, Any]]:
        """What the kernel sent this comm while running a cell."""
        return [_checked(m["content"]["data"]) for m in run.messages if m["msg_type"] == "comm_msg" and m["content"]["comm_id"] == self.comm_id]

    def wait_for(self, accept: Any, timeout: float = 10.0) -> dict[str, Any]:
        """The first message on this comm, sent under any parent, that ``accept`` takes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                msg = self.kernel.client.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                continue
            if msg["msg_type"] == "comm_msg" and msg["content"]["comm_id"] == self.comm_id and accept(msg["content"]["data"]):
                return _checked(msg["content"]["data"])
        raise TimeoutError("no such message from the kernel")

    def close(self) -> None:
        self._request("comm_close", {"comm_id": self.comm_id, "data": {}})

    def _request(self, msg_type: str, content: dict[str, Any]) -> list[dict[str, Any]]:
        client = self.kernel.client
        msg = client.session.msg(msg_type, content)
        client.shell_channel.send(msg)
        answers, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline:
            reply = client.get_iopub_msg(timeout=30)
            if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            if reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
                return answers
            if reply["msg_type"] == "comm_msg":
                answers.append(_checked(reply["content"]["data"]))
        raise TimeoutError(f"the kernel did not answer {msg_type}")


def _states(pushes: list[dict[str, Any]]) -> list[str | None]:
    return [(p["workers"] or {}).get("state") for p in pushes if p["type"] == "status"]


def test_without_the_extension_the_kernel_sends_nothing(clean: Kernel) -> None:
    runs = [clean.execute(code) for code in ("%distributed start -n 2", "%%distributed\nx = 1", "%distributed stop")]
    assert all(r.status == "ok" for r in runs), [r.stderr for r in runs]
    assert [m for r in runs for m in r.messages if m["msg_type"].startswith("comm")] == []


def test_pushes_follow_start_a_busy_cell_and_stop(clean: Kernel) -> None:
    front = Frontend(clean)
    assert front.open() == [{"type": "status", "version": 1, "workers": None, "message": None}]
    start = clean.execute("%distributed start -n 2")
    (started,) = front.pushes(start)
    workers = started["workers"]
    assert (workers["state"], workers["num_processes"], workers["cell"]) == ("idle", 2, None)
    assert sorted(r["pid"] for r in workers["ranks"]) == sorted(psutil.Process(clean.pid).children()[i].pid for i in range(2))
    assert [r["device"] for r in workers["ranks"]] == ["cpu", "cpu"] and all(r["host_memory"] > 10 * 2**20 for r in workers["ranks"])

    cell = clean.execute("%%distributed\nimport time\ntime.sleep(1)")
    assert cell.status == "ok", cell.stderr
    busy, idle = front.pushes(cell)
    assert busy["workers"]["state"] == "busy" and busy["workers"]["cell"] == cell.reply["content"]["execution_count"]
    assert [r["state"] for r in busy["workers"]["ranks"]] == ["busy", "busy"]
    assert idle["workers"]["state"] == "idle"
    assert idle["workers"]["ranks"][0]["last_cell"] == f"[{cell.reply['content']['execution_count']}]"

    (asked,) = front.send({"request": "status"})
    assert _states([asked]) == ["idle"]
    plain = clean.execute("y = 2")  # a cell not on the workers: the status read prints nothing
    assert plain.stdout == "" and plain.stderr == "" and _states(front.pushes(plain)) in ([], ["idle"])
    stop = clean.execute("%distributed stop")
    assert _states(front.pushes(stop)) == [None]
    front.close()


def test_stop_and_restart_requests_from_the_panel(clean: Kernel) -> None:
    front = Frontend(clean)
    front.open()
    clean.execute("%distributed start -n 2")
    before = {p.pid for p in psutil.Process(clean.pid).children()}
    (restarted,) = front.send({"request": "restart"})
    after = {r["pid"] for r in restarted["workers"]["ranks"]}
    assert restarted["workers"]["state"] == "idle" and len(after) == 2 and not after & before
    (stopped,) = front.send({"request": "stop"})
    assert stopped["workers"] is None
    assert psutil.Process(clean.pid).children() == []  # no process left
    refused = front.send({"request": "stop"})
    assert refused[0] == {"type": "error", "request": "stop", "message": "no workers running: start them with %distributed start [-n N]"}
    assert front.send({"request": "reboot"})[0]["message"].startswith("unknown request 'reboot'")
    front.close()


def test_restart_and_stop_are_refused_while_a_cell_runs_on_the_workers(clean: Kernel) -> None:
    front = Frontend(clean)
    front.open()
    clean.execute("%distributed start -n 2")
    # A request that arrives during a cell (over a subshell) finds the comm marked busy.
    code = "from nbaccel.notebook.workers_comm import _ATTACHED\nc, = _ATTACHED.values()\nc._busy = (7, 0.0)\nc.handle('stop')\nc._busy = None"
    run = clean.execute(code)
    assert run.status == "ok", run.stderr
    error = next(p for p in front.pushes(run) if p["type"] == "error")
    assert error["message"] == "a cell is running on the workers; interrupt it first, then stop them"
    assert len(psutil.Process(clean.pid).children()) == 2  # still running
    front.close()


def test_a_worker_killed_while_idle_is_pushed_as_a_crash(clean: Kernel) -> None:
    front = Frontend(clean)
    front.open()
    clean.execute("%distributed start -n 2")
    (status,) = front.send({"request": "status"})
    victim = status["workers"]["ranks"][1]["pid"]
    os.kill(victim, signal.SIGKILL)
    crashed = front.wait_for(lambda d: (d.get("workers") or {}).get("state") == "crashed")
    assert crashed["workers"]["ranks"][1]["state"] == "ended" and crashed["workers"]["message"] == "rank(s) 1 ended"
    front.close()
