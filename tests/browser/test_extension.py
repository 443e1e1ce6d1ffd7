"""nbaccel's JupyterLab extension in a real JupyterLab 4 and Notebook 7 (Debian's chromium,
Playwright): saved rank tabs, reopened untrusted; the workers status item and panel over the comm.

The server loads the extension built in ``nbaccel/labextension`` (scripts/build-extension.sh)
from a private JUPYTER_PATH laid out as the wheel's shared-data lays it out, so the venv is left
as it is. Without a build the tests skip, unless NBACCEL_REQUIRE_EXTENSION=1 (CI) makes that a
failure. Screenshots go to ``$NBACCEL_SCREENSHOTS`` (default: the test's temporary folder).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.browser.jupyterlab_server import CHROMIUM, CHROMIUM_ARGS, Lab, jupyterlab
from tests.browser.test_jupyterlab import _has_notebook7, _quiet_settings, _wait_for_kernel

# Chromium's crash handlers outlive the browser Playwright closes: they end as orphans of the test process.
pytestmark = [pytest.mark.browser, pytest.mark.timeout(240), pytest.mark.orphans]
nbformat = pytest.importorskip("nbformat")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed; run scripts/install-browser-deps.sh")

BUILT = Path(__file__).resolve().parents[2] / "nbaccel" / "labextension"
INSTALL_JSON = Path(__file__).resolve().parents[2] / "extension" / "install.json"

FAILING_CELL = """%%distributed -n 2
from IPython.display import HTML, display
rank = state.process_index
print(f"hello from rank {rank}", flush=True)
if rank == 1:
    display(HTML("<b class='from-rank-1'>html from rank 1</b>"))
    raise ValueError("rank 1 broke")
"""


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    if not (BUILT / "static" / "style.js").exists():
        if os.environ.get("NBACCEL_REQUIRE_EXTENSION") == "1":
            pytest.fail(f"NBACCEL_REQUIRE_EXTENSION=1 but {BUILT} is not built; run scripts/build-extension.sh")
        pytest.skip(f"the extension is not built ({BUILT}); run scripts/build-extension.sh")
    shared = tmp_path / ".home" / "share" / "labextensions" / "nbaccel"
    shared.mkdir(parents=True)
    for name, source in (("package.json", BUILT / "package.json"), ("static", BUILT / "static"), ("install.json", INSTALL_JSON)):
        (shared / name).symlink_to(source)
    _quiet_settings(tmp_path)
    env = {"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path / ".home" / "logs"), "JUPYTER_PATH": str(shared.parents[1])}
    with jupyterlab(tmp_path, env=env) as server:
        yield server


@pytest.fixture
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("NBACCEL_SCREENSHOTS") or tmp_path / "screenshots") / "extension"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _notebook(root: Path, name: str, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = root / name
    nbformat.write(nb, path)
    return path


def _page(browser: sync_api.Browser) -> sync_api.Page:
    page = browser.new_page(viewport={"width": 1200, "height": 950})
    page.set_default_timeout(60_000)
    return page


def _check_rank_tabs(page: sync_api.Page) -> None:
    """The live view's look: rank 0 first and selected, rank 1 failed in words, its traceback
    first in its panel, its display(HTML) in its own tab."""
    view = page.locator(".nbaccel-ranks")
    view.wait_for(state="visible")
    tabs = view.locator("[role='tab']")
    assert [t.strip() for t in tabs.all_inner_texts()] == ["rank 0 · stopped", "✗ rank 1 · failed (ValueError)"] or [
        t.strip() for t in tabs.all_inner_texts()
    ] == ["rank 0 · done", "✗ rank 1 · failed (ValueError)"]
    assert tabs.nth(0).get_attribute("aria-selected") == "true" and tabs.nth(1).get_attribute("aria-selected") == "false"
    panels = view.locator("[role='tabpanel']")
    assert panels.nth(0).is_visible() and not panels.nth(1).is_visible()
    assert "hello from rank 0" in panels.nth(0).inner_text()
    assert "✗ rank 1 · failed" in view.locator(".nbaccel-ranks-chips").inner_text()
    tabs.nth(1).click()
    assert panels.nth(1).is_visible() and not panels.nth(0).is_visible()
    first = panels.nth(1).locator(":scope > *").first
    assert "nbaccel-failure" in (first.get_attribute("class") or "")
    assert "rank 1 failed: ValueError: rank 1 broke" in first.inner_text() and "Traceback" in first.inner_text()
    assert panels.nth(1).locator("b.from-rank-1").inner_text() == "html from rank 1"
    assert panels.nth(0).locator("b.from-rank-1").count() == 0
    assert page.locator(".nbaccel-launch-static").count() == 0  # the html fallback is not what shows


def _run_all(page: sync_api.Page) -> None:
    page.get_by_role("menuitem", name="Run").click()
    page.get_by_text("Run All Cells", exact=True).click()


def _reopen_untrusted(lab: Lab, path: Path) -> None:
    """Shut the kernel down and rewrite the file as another tool would: no longer signed, untrusted."""
    for session in lab.api("GET", "sessions") or []:  # type: ignore[union-attr]
        lab.api("DELETE", f"sessions/{session['id']}")
    nb = nbformat.read(path, as_version=4)
    nb.metadata["reopened"] = True
    nbformat.write(nb, path)


def test_saved_rank_tabs_after_the_cell_and_reopened_in_lab_and_notebook7(lab: Lab, browser: sync_api.Browser, shots: Path) -> None:
    path = _notebook(lab.root, "ranks.ipynb", ["%load_ext nbaccel", FAILING_CELL])
    page = _page(browser)
    try:
        page.goto(lab.url(f"lab/tree/{path.name}"))
        _wait_for_kernel(page, lab, path.name)
        _run_all(page)
        _check_rank_tabs(page)  # the cell that just ended
        page.screenshot(path=str(shots / "lab-ended.png"), full_page=True)
        page.keyboard.press("Control+s")
        _wait_saved(path)
        page.close()
        _reopen_untrusted(lab, path)
        for ui, prefix in (("lab", "lab/tree"), ("notebook7", "notebooks")):
            if ui == "notebook7" and not _has_notebook7():
                continue  # scripts/install-browser-deps.sh installs Notebook 7
            page = _page(browser)
            page.goto(lab.url(f"{prefix}/{path.name}"))
            _check_rank_tabs(page)
            page.screenshot(path=str(shots / f"{ui}-reopened.png"), full_page=True)
            page.close()
    except Exception:
        if not page.is_closed():
            page.screenshot(path=str(shots / "failure-tabs.png"), full_page=True)
        raise


def _wait_saved(path: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        outputs = nbformat.read(path, as_version=4).cells[1].get("outputs", [])
        if any("application/vnd.nbaccel.ranks+json" in o.get("data", {}) for o in outputs):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{path} was not saved with the rank bundle within 20 s")


def _run_cell(page: sync_api.Page, index: int) -> None:
    page.locator(".jp-Cell").nth(index).locator(".jp-InputPrompt").click()
    page.keyboard.press("Shift+Enter")


def _status(page: sync_api.Page, pattern: str) -> str:
    item = page.locator(".nbaccel-workers-status")
    page.wait_for_function("(re) => new RegExp(re).test(document.querySelector('.nbaccel-workers-status')?.textContent ?? '')", arg=pattern, timeout=60_000)
    return item.inner_text()


def test_status_item_follows_the_workers_and_its_stop_button_stops_them(lab: Lab, browser: sync_api.Browser, shots: Path) -> None:
    seen_busy = lab.root / "seen-busy"  # the test makes it once the browser showed the busy cell: no "long enough"
    cells = [
        "%load_ext nbaccel",
        "%distributed start -n 2",
        f"%%distributed\nimport os, time\nwhile not os.path.exists({str(seen_busy)!r}):\n    time.sleep(0.05)",
        "%distributed stop",
        "%%distributed\nimport time\ntime.sleep(60)",
    ]
    path = _notebook(lab.root, "workers.ipynb", cells)
    page = _page(browser)
    try:
        page.goto(lab.url(f"lab/tree/{path.name}"))
        _wait_for_kernel(page, lab, path.name)
        _run_cell(page, 0)
        assert _status(page, "^nbaccel: no workers$")
        _run_cell(page, 1)
        assert _status(page, "^nbaccel: 2 ranks idle$")
        page.reload()  # a reloaded page rejoins the comm its predecessor left open
        _wait_for_kernel(page, lab, path.name)
        assert _status(page, "^nbaccel: 2 ranks idle$")
        _run_cell(page, 2)
        busy = _status(page, r"^nbaccel: 2 ranks busy \(cell \[3\], 0:0\d\)$")
        page.screenshot(path=str(shots / "status-busy.png"))
        seen_busy.touch()
        assert _status(page, "^nbaccel: 2 ranks idle$"), busy
        _run_cell(page, 3)
        assert _status(page, "^nbaccel: no workers$")

        _run_cell(page, 1)  # start again: interrupt a long cell, then stop from the panel
        _status(page, "^nbaccel: 2 ranks idle$")
        _run_cell(page, 4)
        _status(page, r"^nbaccel: 2 ranks busy \(cell \[\d+\], 0:0\d\)$")
        page.locator(".nbaccel-workers-status").click()
        panel = page.locator("#nbaccel-workers-panel")
        panel.wait_for(state="visible")
        started = time.monotonic()
        panel.get_by_role("button", name="Interrupt").click()  # the kernel's interrupt, as the stop button
        _status(page, "^nbaccel: 2 ranks idle$")
        assert time.monotonic() - started < 30, "the interrupt did not end the 60 s cell"
        assert "KeyboardInterrupt" in page.locator(".jp-Cell").nth(4).locator(".jp-OutputArea").inner_text()
        panel.locator("tbody tr").nth(1).wait_for(state="visible")
        pids = [int(t) for t in panel.locator("tbody tr td:nth-child(2)").all_inner_texts()]
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
        page.screenshot(path=str(shots / "workers-panel.png"))
        panel.get_by_role("button", name="Stop").click()
        dialog = page.locator(".jp-Dialog")
        assert "Stop the 2 nbaccel worker processes?" in dialog.inner_text()
        dialog.get_by_role("button", name="Stop").click()
        assert _status(page, "^nbaccel: no workers$")
        deadline = time.monotonic() + 10
        while any(_running(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_running(p) for p in pids), "the workers outlived Stop"
    except Exception:
        page.screenshot(path=str(shots / "failure-workers.png"), full_page=True)
        raise
    finally:
        page.close()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
