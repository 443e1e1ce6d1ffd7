"""A launch's live widgets rendered by ipywidgets' html manager (``@jupyter-widgets/html-manager``,
the widget manager of pages outside JupyterLab), in Chromium, with the Tab titles hidden.

VS Code's own renderer (``@vscode/jupyter-ipywidgets8``) is not driven here: it runs only inside
VS Code's notebook webview, talking to VS Code's extension host, which brokers the kernel's
messages (docs/frontends.md says why). What stands in: a real kernel runs a 2-rank launch from a
cell sent with VS Code's cell id (so with VS Code's pace), the test keeps every widget message the
kernel sent up to a moment in the middle of the launch, as a frontend receives them, and the html
manager renders that widget state, with the Tab titles hidden as VS Code hides them. Each rank's
panel must say its rank and state, and show its lines.

Needs: ``scripts/install-browser-deps.sh`` (chromium, playwright, and ``npm ci`` in tests/browser).
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from tests.browser.jupyterlab_server import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180), pytest.mark.orphans]

EMBED = Path(__file__).resolve().parent / "node_modules" / "@jupyter-widgets" / "html-manager" / "dist" / "embed.js"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing; run scripts/install-browser-deps.sh", allow_module_level=True)
if not EMBED.exists():
    pytest.skip(f"{EMBED} is missing; run scripts/install-browser-deps.sh (npm ci in tests/browser)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed; run scripts/install-browser-deps.sh")

from tests.browser.test_frontends_browser import HIDE_TAB_TITLES, _cell  # noqa: E402 - after the skips above
from tests.kernel.test_frontend_rate_kernel import VSCODE_CELL, _open_control_comm  # noqa: E402
from tests.kernel_harness import running_kernel  # noqa: E402


class WidgetState:
    """The widget models a frontend holds, built from the kernel's comm messages as they come."""

    def __init__(self) -> None:
        self.models: dict[str, dict[str, Any]] = {}

    def apply(self, msg: dict[str, Any]) -> None:
        content, kind = msg["content"], msg["msg_type"]
        if kind == "comm_open" and content.get("target_name") == "jupyter.widget":
            state = dict(content["data"]["state"])
            self.models[content["comm_id"]] = {
                "model_name": state["_model_name"],
                "model_module": state["_model_module"],
                "model_module_version": state["_model_module_version"],
                "state": state,
            }
        elif kind == "comm_msg" and content["comm_id"] in self.models and content["data"].get("method") == "update":
            self.models[content["comm_id"]]["state"].update(content["data"]["state"])
        elif kind == "comm_close":
            self.models.pop(content["comm_id"], None)

    def text(self) -> str:
        return json.dumps(self.models, ensure_ascii=False)

    def page(self, root: str) -> str:
        state = json.dumps({"version_major": 2, "version_minor": 0, "state": self.models}).replace("</", "<\\/")
        view = json.dumps({"version_major": 2, "version_minor": 0, "model_id": root})
        return (
            f"<!doctype html><html><head><meta charset='utf-8'><style>{HIDE_TAB_TITLES}</style>"
            f"<script src='{EMBED.as_uri()}'></script>"
            f"<script type='application/vnd.jupyter.widget-state+json'>{state}</script></head>"
            f"<body><script type='application/vnd.jupyter.widget-view+json'>{view}</script></body></html>"
        )


def _live_state(tmp_path: Path) -> tuple[WidgetState, str]:
    """The widget state in the middle of a 2-rank launch from a VS Code cell, and its root model."""
    release = tmp_path / "release"
    with running_kernel(env={"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path / "logs")}) as kernel:
        assert kernel.execute("%load_ext nbaccel").status == "ok"
        _open_control_comm(kernel)
        content = {"code": _cell(2, release), "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
        msg = kernel.client.session.msg("execute_request", content, metadata={"cellId": VSCODE_CELL})
        kernel.client.shell_channel.send(msg)
        state, root, snapshot, deadline = WidgetState(), "", None, time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                got = kernel.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                continue
            if got["parent_header"].get("msg_id") != msg["header"]["msg_id"]:
                continue
            if got["msg_type"] == "display_data" and not root:
                root = got["content"]["data"]["application/vnd.jupyter.widget-view+json"]["model_id"]
            state.apply(got)
            if snapshot is None and all(f"tick 3 on rank {r}" in state.text() and f"rank {r} · running" in state.text() for r in (0, 1)):
                snapshot = json.loads(state.text())
                release.touch()
            if got["msg_type"] == "status" and got["content"]["execution_state"] == "idle":
                break
        assert snapshot is not None and root, "the launch never showed both ranks running"
        live = WidgetState()
        live.models = snapshot
        return live, root


def test_the_html_manager_renders_a_launchs_widgets_legible_without_tab_titles(tmp_path: Path) -> None:
    state, root = _live_state(tmp_path)
    page_file = tmp_path / "view.html"
    page_file.write_text(state.page(root))
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--allow-file-access-from-files"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.set_default_timeout(30_000)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(page_file.as_uri())
            launch = page.locator(".nbaccel-launch")
            launch.wait_for(state="visible")
            tabs = launch.locator(".lm-TabBar-tab")
            assert tabs.count() == 2 and [t.strip() for t in tabs.all_inner_texts()] == ["", ""]  # no titles to read
            assert "rank 0 · running" in launch.locator(".nbaccel-chips").inner_text()
            assert "rank 1 · running" in launch.locator(".nbaccel-chips").inner_text()
            for rank in (0, 1):
                tabs.nth(rank).click()
                visible = launch.locator(".nbaccel-rank-panel:visible")
                visible.locator(".nbaccel-rank-header").get_by_text(f"rank {rank} · running").wait_for(state="visible")
                visible.get_by_text(f"tick 3 on rank {rank}").wait_for(state="visible")
            page.screenshot(path=str(tmp_path / "html-manager.png"))
            assert errors == []
        finally:
            browser.close()
