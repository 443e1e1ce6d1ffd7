"""VS Code notebooks get widgets after ``%load_ext nbaccel`` too; Colab and classic notebooks keep text.

VS Code sends every cell's document URI (``vscode-notebook-cell:...``) as the execute_request's
``cellId``; the detection reads it from the request being handled.

Imports internals (output): it tests those units directly, below the public face.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from typing import Any

import pytest

from nbaccel.output import frontend

VSCODE_CELL = "vscode-notebook-cell:/home/me/train.ipynb#W2sZmlsZQ%3D%3D"
VSCODE_REMOTE_CELL = "vscode-notebook-cell://ssh-remote%2Bgpu-box/home/me/train.ipynb#X10sdnNjb2RlLXJlbW90ZQ%3D%3D"


class FakeKernel:
    """What the detection reads from ipykernel: a comm manager and the request being handled."""

    def __init__(self) -> None:
        self.comm_manager = type("CommManager", (), {"targets": {}, "register_target": lambda self, name, handler: self.targets.__setitem__(name, handler)})()
        self.parent: dict[str, Any] = {}

    def get_parent(self) -> dict[str, Any]:
        return self.parent


class FakeShell:
    def __init__(self) -> None:
        self.kernel = FakeKernel()

    def cell(self, **metadata: Any) -> FakeShell:
        self.kernel.parent = {"header": {"msg_type": "execute_request"}, "metadata": metadata}
        return self


@pytest.fixture(autouse=True)
def fresh_detection() -> Iterator[None]:
    frontend.reset_for_tests()
    yield
    frontend.reset_for_tests()


@pytest.mark.parametrize("cell_id", [VSCODE_CELL, VSCODE_REMOTE_CELL, "vscode-interactive-input:/InteractiveInput-1"])
def test_a_vscode_cell_means_widgets_when_nbaccel_was_loaded_by_a_cell(cell_id: str) -> None:
    shell = FakeShell().cell(cellId=cell_id)  # %load_ext ran in a cell: the control comm was missed
    frontend.watch(shell)
    assert frontend.widget_frontend_attached(shell)


@pytest.mark.parametrize(
    "metadata",
    [
        {},  # nbclient, nbconvert, jupyter console, classic Notebook 6, Colab
        {"cellId": "8f3b2c1e-4d5a-4b6c-9e7f-0a1b2c3d4e5f"},  # an nbformat cell id, not a VS Code URI
        {"cellId": None},
        {"cellId": "file:///home/me/train.ipynb"},
        {"colab": {"cell_id": "abc"}},
    ],
    ids=["none", "nbformat-id", "null", "other-scheme", "colab-style"],
)
def test_other_frontends_keep_the_text_view(metadata: dict[str, Any]) -> None:
    shell = FakeShell().cell(**metadata)
    frontend.watch(shell)
    assert not frontend.widget_frontend_attached(shell)


def test_the_cell_decides_not_the_first_one() -> None:
    shell = FakeShell().cell()
    frontend.watch(shell)
    assert not frontend.widget_frontend_attached(shell)
    assert frontend.widget_frontend_attached(shell.cell(cellId=VSCODE_CELL))


@pytest.mark.kernel
@pytest.mark.timeout(60)
def test_in_a_real_kernel_the_vscode_cell_id_of_the_request_is_what_counts() -> None:
    from tests.kernel_harness import running_kernel

    with running_kernel(env={"NBACCEL_OUTPUT": "auto"}) as kernel:
        assert execute(kernel, "%load_ext nbaccel") == ""
        check = "from nbaccel.output.frontend import widget_frontend_attached; print(widget_frontend_attached())"
        assert execute(kernel, check).strip() == "False"
        assert execute(kernel, check, cellId=VSCODE_CELL).strip() == "True"


def execute(kernel: Any, code: str, **metadata: Any) -> str:
    """Send an execute_request with ``metadata`` (as VS Code does); its stdout."""
    client = kernel.client
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msg = client.session.msg("execute_request", content, metadata=metadata)
    client.shell_channel.send(msg)
    deadline, out = time.monotonic() + 30, []
    while time.monotonic() < deadline:
        try:
            reply = client.get_iopub_msg(timeout=1)
        except queue.Empty:
            continue
        if reply["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
            continue
        if reply["msg_type"] == "stream":
            out.append(reply["content"]["text"])
        elif reply["msg_type"] == "error":
            raise AssertionError(reply["content"]["evalue"])
        elif reply["msg_type"] == "status" and reply["content"]["execution_state"] == "idle":
            return "".join(out)
    raise TimeoutError(code)
