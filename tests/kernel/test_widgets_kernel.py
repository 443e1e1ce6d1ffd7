"""The widget view in a real ipykernel, driven through jupyter_client as a notebook frontend drives it.

Checks the comm and display messages the widgets send (rank panels, titles, failure marking,
the static bundle that replaces the widget), rich output from the ranks (display(HTML), a
matplotlib figure, tqdm bars), and which sink ``output="auto"`` picks for which frontend.
"""

from __future__ import annotations

import json
import queue
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kernel_harness import Execution, Kernel, running_kernel

pytestmark = [pytest.mark.kernel, pytest.mark.timeout(120)]

RICH_LAUNCH = r"""
import nbaccel

def wait_until_exited(marker):
    '''Rank 1's side: fail only after rank 0 has returned and exited, so rank 0 ends as 'done'.'''
    import os, time
    while not os.path.exists(marker) or not open(marker).read():
        time.sleep(0.01)
    status = f"/proc/{open(marker).read()}/status"
    while True:
        try:
            if "zombie" in open(status).read():
                return
        except FileNotFoundError:
            return
        time.sleep(0.01)


def work():
    import os, time
    import matplotlib.pyplot as plt
    from IPython.display import HTML, display
    from tqdm.auto import tqdm
    rank = int(os.environ["RANK"])
    display(HTML(f"<b>hello</b> from rank {rank}"))
    for step in tqdm(range(20), desc="train", mininterval=0):
        time.sleep(0.005)
    plt.plot([0, 1], [rank, 1 - rank]); plt.show()
    print(f"line from rank {rank}", flush=True)
    if rank == 1:
        wait_until_exited(MARKER)  # so what rank 0 shows (and its status) never depends on timing
        raise ValueError("rank 1 broke")
    open(MARKER, "w").write(str(os.getpid()))
    return rank

import tempfile, os
MARKER = os.path.join(tempfile.mkdtemp(), "rank0-done")
try:
    nbaccel.notebook_launcher(work, num_processes=2, output=OUTPUT)
except nbaccel.RankFailedError as error:
    print("raised:", str(error).splitlines()[0])
"""


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kernel]:
    logs = tmp_path_factory.mktemp("logs")
    with running_kernel(env={"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(logs)}) as k:
        yield k


def _no_ranks_left(kernel: Kernel) -> None:
    assert kernel.children() == []


def _opened(run: Execution, model: str) -> list[dict[str, Any]]:
    return [m["content"] for m in run.of_type("comm_open") if m["content"]["data"]["state"].get("_model_name") == model]


def _updates(run: Execution, comm_id: str, key: str) -> list[Any]:
    return [
        m["content"]["data"]["state"][key]
        for m in run.of_type("comm_msg")
        if m["content"]["comm_id"] == comm_id and key in m["content"]["data"].get("state", {})
    ]


def _outputs_of_every_output_widget(run: Execution) -> list[dict[str, Any]]:
    """The latest outputs of every Output widget, as the frontend would have them."""
    found = []
    for opened in _opened(run, "OutputModel"):
        updates = _updates(run, opened["comm_id"], "outputs")
        found.extend(updates[-1] if updates else opened["data"]["state"].get("outputs", []))
    return found


def test_the_widget_view_messages_rich_output_and_failure_marking(kernel: Kernel) -> None:
    run = kernel.execute(RICH_LAUNCH.replace("OUTPUT", "'widgets'"), timeout=90)
    assert run.status == "ok", run.stderr
    assert run.stdout == "raised: rank 1 failed: ValueError: rank 1 broke\n"

    # One display of the launch's root widget, later replaced (same display id) by the static view.
    (shown,) = run.of_type("display_data")
    root_id = shown["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
    assert root_id in {c["comm_id"] for c in _opened(run, "VBoxModel")}
    display_id = shown["content"]["transient"]["display_id"]
    (final,) = run.of_type("update_display_data")
    assert final["content"]["transient"]["display_id"] == display_id
    assert set(final["content"]["data"]) == {"application/vnd.nbaccel.ranks+json", "text/html", "text/plain"}
    ranks = final["content"]["data"]["application/vnd.nbaccel.ranks+json"]["ranks"]  # the extension's rank tabs
    assert ranks[1]["status"]["kind"] == "failed" and "ValueError" in ranks[1]["failure"]["traceback"][0]

    # Rank tabs: rank 0 first and selected; the failing rank's title says so in words.
    (tab,) = _opened(run, "TabModel")
    assert tab["data"]["state"]["selected_index"] == 0
    assert _updates(run, tab["comm_id"], "selected_index") == []  # never moved off rank 0
    titles = _updates(run, tab["comm_id"], "titles")
    assert titles[-1][0] == "rank 0 · done" and titles[-1][1] == "rank 1 · failed (ValueError)"
    assert ["rank 0 · running", "rank 1 · running"] in titles

    # Rich output reached the panels: HTML, the figure as a PNG, the lines, and rank 1's traceback.
    outputs = _outputs_of_every_output_widget(run)
    html = [o["data"]["text/html"] for o in outputs if o["output_type"] == "display_data" and "text/html" in o["data"]]
    assert sorted(html) == ["<b>hello</b> from rank 0", "<b>hello</b> from rank 1"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    streams = "".join(o["text"] for o in outputs if o["output_type"] == "stream")
    assert "line from rank 0" in streams and "line from rank 1" in streams
    (error,) = [o for o in outputs if o["output_type"] == "error"]
    assert error["ename"] == "ValueError" and error["traceback"][0] == "rank 1 failed: ValueError: rank 1 broke"

    # tqdm: one live bar per rank, no text lines; rank 1's bar finished before it raised.
    bars = _opened(run, "FloatProgressModel")
    assert len(bars) == 2
    assert all(_updates(run, b["comm_id"], "value")[-1] == 1.0 for b in bars)
    assert "train" not in run.stderr and "train" not in streams

    # The header's chip for rank 1 says failed, with the exit code, in words.
    chips = [c for c in _opened(run, "HTMLModel") if "rank 1 ·" in c["data"]["state"].get("value", "")]
    assert any("failed: ValueError, exit code 1" in v for c in chips for v in _updates(run, c["comm_id"], "value"))

    # The saved notebook keeps a static view: rank 0 first, the failure open, no widget needed.
    plain, page = final["content"]["data"]["text/plain"], final["content"]["data"]["text/html"]
    assert plain.index("── rank 0 · done") < plain.index("── rank 1 · failed (ValueError)")
    assert "line from rank 0" in plain and "rank 1 failed: ValueError: rank 1 broke" in plain
    assert "<details open><summary><b>✗ rank 1 · failed (ValueError)" in page and "<img src='data:image/png;base64," in page

    # Every widget was closed at the end (the kernel keeps none of them).
    closed = {m["content"]["comm_id"] for m in run.of_type("comm_close")}
    assert {c["comm_id"] for c in run.of_type("comm_open") for c in [c["content"]]} <= closed
    _no_ranks_left(kernel)


def test_full_logs_of_every_rank_are_in_the_launch_folder(kernel: Kernel) -> None:
    run = kernel.execute(
        "import nbaccel\n"
        "def chatty():\n"
        "    import os\n"
        "    for i in range(3000): print(f'r{os.environ[\"RANK\"]} line {i}')\n"
        "nbaccel.notebook_launcher(chatty, num_processes=2, output='widgets')",
        timeout=90,
    )
    assert run.status == "ok", run.stderr
    plain = run.of_type("update_display_data")[0]["content"]["data"]["text/plain"]
    folder = Path(plain.splitlines()[1].removeprefix("full logs: "))
    for rank in (0, 1):
        assert (folder / f"rank{rank}.log").read_text().splitlines() == [f"r{rank} line {i}" for i in range(3000)]
    assert "earlier lines not shown; the full log is in" in plain


def test_auto_picks_text_under_a_bare_jupyter_client(kernel: Kernel) -> None:
    run = kernel.execute(RICH_LAUNCH.replace("OUTPUT", "'auto'"), timeout=90)
    assert run.status == "ok"
    assert run.of_type("comm_open") == []
    lines = run.stdout.splitlines()
    assert "[rank 0] <IPython.core.display.HTML object>" in lines and "[rank 1] line from rank 1" in lines
    assert "[rank 0] <Figure size 640x480 with 1 Axes>" in lines and lines[-1] == "raised: rank 1 failed: ValueError: rank 1 broke"
    bar_lines = [line for line in lines if "train" in line]
    assert 2 <= len(bar_lines) <= 12  # a few states per bar, never one line per step
    assert any(line.startswith("[rank 0] train: 100%") for line in bar_lines)
    _no_ranks_left(kernel)


def _execute_as(kernel: Kernel, code: str, metadata: dict[str, Any], timeout: float = 60.0) -> Execution:
    """Like Kernel.execute, with execute_request metadata (what JupyterLab sends with each cell)."""
    client = kernel.client
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msg = client.session.msg("execute_request", content, metadata=metadata)
    client.shell_channel.send(msg)
    return _collect(kernel, msg["header"]["msg_id"], timeout)


def _collect(kernel: Kernel, msg_id: str, timeout: float) -> Execution:
    started, messages = time.monotonic(), []
    while True:
        try:
            msg = kernel.client.get_iopub_msg(timeout=max(0.01, started + timeout - time.monotonic()))
        except queue.Empty:
            raise TimeoutError(f"no idle within {timeout} s") from None
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
        messages.append(msg)
    while True:
        reply = kernel.client.get_shell_msg(timeout=10)
        if reply["parent_header"].get("msg_id") == msg_id:
            return Execution(reply=reply, messages=messages, elapsed=time.monotonic() - started)


PICK = "import nbaccel.output.choose as s; print(type(s.make_sink(None)).__name__)"


def test_auto_picks_widgets_for_a_jupyterlab_notebook_cell(tmp_path: Path) -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path)}) as k:
        assert k.execute(PICK).stdout == "RichTextSink\n"
        lab_cell = {"deletedCells": [], "recordTiming": False, "cellId": str(uuid.uuid4())}
        assert _execute_as(k, PICK, lab_cell).stdout == "WidgetSink\n"
        nbclient_cell = {"cellId": str(uuid.uuid4())}
        assert _execute_as(k, PICK, nbclient_cell).stdout == "RichTextSink\n"


def test_auto_picks_widgets_once_a_frontend_opens_the_widget_control_comm(tmp_path: Path) -> None:
    with running_kernel(env={"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path)}) as k:
        assert k.execute(PICK).stdout == "RichTextSink\n"  # nbaccel is loaded and watching from here on
        comm_id = uuid.uuid4().hex
        opening = k.client.session.msg("comm_open", {"comm_id": comm_id, "target_name": "jupyter.widget.control", "data": {}}, metadata={"version": "1.0.0"})
        k.client.shell_channel.send(opening)  # what JupyterLab's widget manager does when it (re)connects
        asking = k.client.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "request_states"}})
        k.client.shell_channel.send(asking)
        deadline = time.monotonic() + 10
        answered = False
        while time.monotonic() < deadline and not answered:
            try:
                msg = k.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            answered = msg["msg_type"] == "comm_msg" and msg["content"]["data"].get("method") == "update_states"
        assert answered, "ipywidgets must still answer the frontend's request for widget states"
        assert k.execute(PICK).stdout == "WidgetSink\n"


def test_a_spawned_launch_shows_rich_output_too(kernel: Kernel) -> None:
    run = kernel.execute(
        "import nbaccel\n"
        "def show():\n"
        "    from IPython.display import display, Markdown\n"
        "    display(Markdown('**from a fresh interpreter**'))\n"
        "nbaccel.notebook_launcher(show, num_processes=1, start_method='spawn', output='widgets')",
        timeout=90,
    )
    assert run.status == "ok", run.stderr
    outputs = _outputs_of_every_output_widget(run)
    assert any(o.get("data", {}).get("text/markdown") == "**from a fresh interpreter**" for o in outputs), json.dumps(outputs)[:500]


SLEEPY = "import nbaccel, time\ndef sleepy():\n    print('started', flush=True)\n    time.sleep(60)\n"


Moment = Callable[[list[dict[str, Any]]], bool]


def shown_in_widgets(text: str, times: int) -> Moment:
    """The moment the kernel has sent ``text`` to the frontend in ``times`` widget messages
    (once per rank: then the kernel is relaying, in its event loop)."""

    def seen(messages: list[dict[str, Any]]) -> bool:
        return sum(text in json.dumps(m["content"]) for m in messages if m["msg_type"] in ("comm_open", "comm_msg")) >= times

    return seen


def files_exist(*paths: Path) -> Moment:
    return lambda _messages: all(p.exists() for p in paths)


def _interrupted(kernel: Kernel, code: str, moments: list[Moment], timeout: float = 60.0) -> Execution:
    """Run ``code``, interrupting the kernel (as the stop button does) at each of ``moments`` in turn."""
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msg = kernel.client.session.msg("execute_request", content)
    kernel.client.shell_channel.send(msg)
    started, messages, pending = time.monotonic(), [], list(moments)
    while pending:
        assert time.monotonic() < started + timeout, f"the cell never reached interrupt {len(moments) - len(pending) + 1}"
        try:
            got = kernel.client.get_iopub_msg(timeout=0.01)
            if got["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                messages.append(got)
        except queue.Empty:
            pass
        if pending[0](messages):
            pending.pop(0)
            kernel.manager.interrupt_kernel()
    run = _collect(kernel, msg["header"]["msg_id"], timeout)
    run.messages[:0] = messages
    return run


def _final_plain(run: Execution) -> str:
    (final,) = run.of_type("update_display_data")
    return final["content"]["data"]["text/plain"]


def test_an_interrupted_launch_ends_its_view_and_says_so(kernel: Kernel) -> None:
    code = SLEEPY + "nbaccel.notebook_launcher(sleepy, num_processes=2, output='widgets')"
    run = _interrupted(kernel, code, [shown_in_widgets("started", times=2)])  # both ranks' first line is shown
    assert run.error is not None and run.error["ename"] == "KeyboardInterrupt"
    plain = _final_plain(run)
    assert "interrupted after" in plain.splitlines()[0]
    assert _header(plain, 0, "interrupted") and _header(plain, 1, "interrupted")
    _no_ranks_left(kernel)


def test_a_timed_out_launch_ends_its_view_and_says_so(kernel: Kernel) -> None:
    run = kernel.execute(SLEEPY + "nbaccel.notebook_launcher(sleepy, num_processes=2, output='widgets', timeout=1.5)", timeout=60)
    assert run.error is not None and run.error["ename"] == "LaunchTimeoutError"
    plain = _final_plain(run)
    assert "timed out after" in plain.splitlines()[0] and _header(plain, 1, "timed out")
    assert "started" in plain
    _no_ranks_left(kernel)


STUBBORN = r"""
import nbaccel, os, signal, time

def stubborn(folder):
    '''Ignores SIGTERM; notes each SIGINT and goes on: only the kernel's SIGKILL ends it.'''
    rank = os.environ["RANK"]
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, lambda *_: open(os.path.join(folder, f"sigint{rank}"), "w").close())
    print("started", flush=True)
    while True:
        time.sleep(0.05)

nbaccel.notebook_launcher(stubborn, (FOLDER,), num_processes=2, output='widgets')
"""


def test_a_second_interrupt_still_ends_the_view(kernel: Kernel, tmp_path: Path) -> None:
    # No hook on the cell's end finishes the view: launch_finished does, whichever way the cell ends.
    # The first interrupt: the ranks get SIGINT, note it and go on; the second, while the kernel
    # waits for them to stop, goes straight to SIGKILL.
    noted = files_exist(tmp_path / "sigint0", tmp_path / "sigint1")
    run = _interrupted(kernel, STUBBORN.replace("FOLDER", repr(str(tmp_path))), [shown_in_widgets("started", times=2), noted])
    assert run.error is not None and run.error["ename"] == "KeyboardInterrupt"
    plain = _final_plain(run)  # the static view replaced the widgets
    assert "interrupted after" in plain.splitlines()[0] and "started" in plain
    assert _header(plain, 0, "interrupted") and _header(plain, 1, "interrupted")  # not left "running"
    closed = {m["content"]["comm_id"] for m in run.of_type("comm_close")}
    assert {m["content"]["comm_id"] for m in run.of_type("comm_open")} <= closed
    _no_ranks_left(kernel)


def _header(plain: str, rank: int, status: str) -> bool:
    """Whether the static view has rank's header with that status (a sampled peak may follow it)."""
    return re.search(rf"── rank {rank} · {status}( · peak [^─]+)? ──", plain) is not None
