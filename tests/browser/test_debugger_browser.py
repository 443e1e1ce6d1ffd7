"""pdb on a rank in a real JupyterLab: the prompt is the notebook's own input box (Debian's chromium
driven by Playwright, as tests/browser/test_jupyterlab.py)."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.jupyterlab_server import CHROMIUM, CHROMIUM_ARGS, Lab, jupyterlab

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180), pytest.mark.orphans]

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing; run scripts/install-browser-deps.sh to install Debian's chromium", allow_module_level=True)
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed; run scripts/install-browser-deps.sh")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed; run scripts/install-browser-deps.sh")

CELL = """%%distributed -n 2 -o both
x = state.process_index * 10 + 7
if state.process_index == 1:
    breakpoint()
x + 1
"""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    folder = tmp_path / ".home" / "settings" / "@jupyterlab" / "apputils-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = {"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path / ".home" / "logs")}
    with jupyterlab(tmp_path, env=env) as server:
        yield server


def _notebook(root: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("%load_ext nbaccel"), nbformat.v4.new_code_cell(CELL), nbformat.v4.new_code_cell("print('both', both)")]
    path = root / "debug.ipynb"
    nbformat.write(nb, path)
    return path


def _wait_for_kernel(page: sync_api.Page, lab: Lab, name: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sessions = lab.api("GET", "sessions") or []
        if [s["kernel"]["execution_state"] for s in sessions if s.get("path", "").endswith(name)] == ["idle"]:  # type: ignore[union-attr]
            break
        time.sleep(0.2)
    else:
        raise TimeoutError(f"the kernel of {name} did not start within 60 s")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.get_by_text("Select Kernel").count():
        dialog.get_by_role("button", name="Select").click()


def test_p_x_typed_into_the_stdin_box_shows_rank_1s_value(lab: Lab, tmp_path: Path) -> None:
    path = _notebook(lab.root)
    shots = Path(os.environ.get("NBACCEL_SCREENSHOTS") or tmp_path / "screenshots") / "debugger"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 950})
            page.set_default_timeout(60_000)
            page.goto(lab.url(f"lab/tree/{path.name}"))
            _wait_for_kernel(page, lab, path.name)
            page.get_by_role("menuitem", name="Run").click()
            page.get_by_text("Run All Cells", exact=True).click()
            try:
                cell = page.locator(".jp-Cell").nth(1)
                box = cell.locator(".jp-Stdin-input")
                box.wait_for(state="visible")
                prompt = cell.locator(".jp-Stdin-prompt").last.inner_text()
                assert prompt.startswith("nbaccel: rank 1 is at a breakpoint") and prompt.rstrip().endswith("(Pdb) rank 1>")
                page.screenshot(path=str(shots / "prompt.png"))
                box.fill("p x")
                box.press("Enter")
                page.wait_for_function("() => [...document.querySelectorAll('.jp-Cell')][1].querySelector('.jp-Stdin-prompt')?.textContent.startsWith('17')")
                page.screenshot(path=str(shots / "p-x.png"))
                box = cell.locator(".jp-Stdin-input")
                box.fill("c")
                box.press("Enter")
                page.locator(".jp-Cell").nth(2).get_by_text("both [8, 18]").wait_for(state="visible")
                assert re.search(r"\(Pdb\) rank 1>\s+p x\n17\n\(Pdb\) rank 1>\s+c", cell.inner_text())  # the session stays in the notebook
                page.screenshot(path=str(shots / "done.png"), full_page=True)
            except Exception:
                page.screenshot(path=str(shots / "failure.png"), full_page=True)
                raise
        finally:
            browser.close()
