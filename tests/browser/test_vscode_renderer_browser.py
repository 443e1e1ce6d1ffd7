"""VS Code's own widget renderer (``@vscode/jupyter-ipywidgets8``, the bundle VS Code's Jupyter
extension loads into its notebook webview) against a real kernel, in Chromium.

The bridge page (``vscode_bridge/bridge.js``, bundled by ``npm run build`` in tests/browser) gives
the renderer's ``WidgetManager`` what VS Code's webview gives it: requirejs, and a kernel
connection. VS Code's is a proxy that posts each kernel message to its extension host, which
talks to the kernel with ``@jupyterlab/services``; here the page holds a ``@jupyterlab/services``
connection itself, over jupyter_server's websocket (the one hop not reproduced). Cells go out
with VS Code's ``vscode-notebook-cell:`` cell id, so the kernel picks VS Code's pace by itself.

A 2-rank ``%%distributed``: the launch is live (lines arrive while the ranks run), every rank's
panel says its rank and state with the Tab titles hidden (as VS Code leaves them: ipywidgets
#3657), rank 0's panel is the one shown first, and the static view replaces the widgets at the end.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.browser.jupyterlab_server import CHROMIUM, CHROMIUM_ARGS, Lab, jupyterlab

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180), pytest.mark.orphans]

HERE = Path(__file__).resolve().parent
BRIDGE = HERE / "node_modules" / ".nbaccel" / "bridge.js"
REQUIREJS = HERE / "node_modules" / "requirejs" / "require.js"
if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing; run scripts/install-browser-deps.sh", allow_module_level=True)
if not BRIDGE.exists() or not REQUIREJS.exists():
    pytest.skip(f"{BRIDGE} is not built; run scripts/install-browser-deps.sh (npm ci and npm run build in tests/browser)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed; run scripts/install-browser-deps.sh")

from tests.browser.test_frontends_browser import HIDE_TAB_TITLES, _cell  # noqa: E402 - after the skips above
from tests.kernel.test_frontend_rate_kernel import VSCODE_CELL  # noqa: E402


def _start_kernel(lab: Lab) -> str:
    request = urllib.request.Request(
        f"http://127.0.0.1:{lab.port}/api/kernels",
        method="POST",
        data=b'{"name": "python3"}',
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        return str(json.loads(response.read())["id"])


def _page(folder: Path) -> Path:
    page = folder / "vscode-bridge.html"
    page.write_text(
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<script src='{REQUIREJS.as_uri()}'></script><script src='{BRIDGE.as_uri()}'></script>"
        "</head><body><div id='out'></div></body></html>"
    )
    return page


def test_vscodes_renderer_shows_a_2_rank_launch_live_and_legible(tmp_path: Path) -> None:
    release = tmp_path / "release"
    env = {"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path / "logs")}
    # The bridge page is a file: page (origin "null"); the server is on loopback with a token.
    with jupyterlab(tmp_path, env=env, args=("--ServerApp.allow_origin=*",)) as lab, sync_api.sync_playwright() as playwright:
        kernel_id = _start_kernel(lab)
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[*CHROMIUM_ARGS, "--allow-file-access-from-files"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 800})
            page.set_default_timeout(60_000)
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(_page(tmp_path).as_uri())
            bridge = {
                "baseUrl": f"http://127.0.0.1:{lab.port}/",
                "token": lab.token,
                "kernelId": kernel_id,
                "cells": ["%load_ext nbaccel", _cell(2, release)],
                "cellId": VSCODE_CELL,
            }
            page.evaluate("(a) => { window.startBridge(a).catch(e => { window.bridgeError = String(e); }); }", bridge)
            launch = page.locator(".nbaccel-launch")
            launch.wait_for(state="visible")
            visible = launch.locator(".nbaccel-rank-panel:visible")
            visible.locator(".nbaccel-rank-header").get_by_text("rank 0 · running").wait_for(state="visible")  # rank 0 first
            visible.get_by_text("tick 2 on rank 0").wait_for(state="visible")
            visible.get_by_text("tick 5 on rank 0").wait_for(state="visible")  # live: more lines while it runs
            page.add_style_tag(content=HIDE_TAB_TITLES)
            tabs = launch.locator(".lm-TabBar-tab")
            assert tabs.count() == 2 and [t.strip() for t in tabs.all_inner_texts()] == ["", ""]
            chips = launch.locator(".nbaccel-chips").inner_text()
            assert "rank 0 · running" in chips and "rank 1 · running" in chips
            tabs.nth(1).click()
            visible.locator(".nbaccel-rank-header").get_by_text("rank 1 · running").wait_for(state="visible")
            visible.get_by_text("tick 2 on rank 1").wait_for(state="visible")
            page.screenshot(path=str(tmp_path / "vscode-renderer-live.png"))
            release.touch()
            static = page.locator(".nbaccel-launch-static")
            static.wait_for(state="visible")
            assert [s.strip() for s in static.locator("details > summary").all_inner_texts()] == ["rank 0 · done", "rank 1 · done"]
            page.wait_for_function("() => window.bridgeDone === true || window.bridgeError !== undefined")
            assert page.evaluate("window.bridgeError") is None and errors == []
        finally:
            browser.close()
