"""%%distributed in a real JupyterLab 4 (and Notebook 7, when installed), in Debian's chromium
driven headless by Playwright.

Checks what a person sees: the rank tabs render with rank 0 first and selected, output shows
while the cell still runs, a failing rank is marked in words, and the saved notebook keeps a
static view of every rank. Screenshots go to ``$NBACCEL_SCREENSHOTS`` (default: the test's
temporary folder).

Needs: ``scripts/install-browser-deps.sh`` (chromium at /usr/bin/chromium; jupyterlab, notebook
and playwright in the venv). Playwright's own browser download is not used.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.jupyterlab_server import CHROMIUM, CHROMIUM_ARGS, Lab, jupyterlab

# Chromium's crash handlers outlive the browser Playwright closes: they end as orphans of the test process.
pytestmark = [pytest.mark.browser, pytest.mark.timeout(180), pytest.mark.orphans]

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing; run scripts/install-browser-deps.sh to install Debian's chromium", allow_module_level=True)
nbformat = pytest.importorskip("nbformat")
pytest.importorskip("jupyterlab", reason="jupyterlab is not installed; run scripts/install-browser-deps.sh")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed; run scripts/install-browser-deps.sh")

CELL = """%%distributed -n 2
import os, time
from tqdm.auto import tqdm
rank = state.process_index
for step in tqdm(range(30), desc="train"):
    time.sleep(0.15)
    if step % 5 == 0:
        print(f"tick {step} on rank {rank}", flush=True)
if rank == 0:
    open(MARKER, "w").close()
    time.sleep(60)  # nbaccel stops it when rank 1 fails
else:
    while not os.path.exists(MARKER):  # fail once rank 0 is through its loop: no timing races
        time.sleep(0.02)
    raise ValueError("rank 1 broke")
"""


def _notebook(root: Path) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [
        nbformat.v4.new_code_cell(f"%load_ext nbaccel\nMARKER = {str(root / 'rank0-done')!r}"),
        nbformat.v4.new_code_cell(CELL),
    ]
    path = root / "ranks.ipynb"
    nbformat.write(nb, path)
    return path


def _quiet_settings(root: Path) -> None:
    """No news or update toasts over the notebook."""
    folder = root / ".home" / "settings" / "@jupyterlab" / "apputils-extension"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notification.jupyterlab-settings").write_text('{"fetchNews": "false", "checkForUpdates": false}')


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    _quiet_settings(tmp_path)
    # NBACCEL_OUTPUT="" (the test session defaults it to text): the kernel must choose by itself.
    # The html fallback, as a reader without nbaccel's extension sees it (tests/browser/test_extension.py: with it).
    config = tmp_path / ".home" / "config"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text('{"disabledExtensions": {"nbaccel": true}}')
    env = {"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(tmp_path / ".home" / "logs"), "JUPYTER_CONFIG_DIR": str(config)}
    with jupyterlab(tmp_path, env=env) as server:
        yield server


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("NBACCEL_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _has_notebook7() -> bool:
    try:
        from importlib.metadata import version

        return int(version("notebook").split(".")[0]) >= 7
    except Exception:  # not installed
        return False


UIS = [
    pytest.param("lab", "lab/tree", id="jupyterlab4"),
    pytest.param(
        "notebook",
        "notebooks",
        id="notebook7",
        marks=pytest.mark.skipif(not _has_notebook7(), reason="Notebook 7 is not installed (scripts/install-browser-deps.sh installs it)"),
    ),
]


@pytest.mark.parametrize(("ui", "prefix"), UIS)
def test_rank_tabs_live_output_failure_marking_and_saved_static_view(lab: Lab, shots: Path, ui: str, prefix: str) -> None:
    path = _notebook(lab.root)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 950})
            page.set_default_timeout(60_000)
            (shots / ui).mkdir(parents=True, exist_ok=True)
            page.goto(lab.url(f"{prefix}/{path.name}"))
            _wait_for_kernel(page, lab, path.name)
            page.get_by_role("menuitem", name="Run").click()
            page.get_by_text("Run All Cells", exact=True).click()
            try:
                _check_live_view(page, shots / ui)
                _check_end_view(page, shots / ui)
                _check_saved_notebook(page, path)
            except Exception:  # not installed
                page.screenshot(path=str(shots / ui / "failure.png"), full_page=True)  # what a person would have seen
                raise
        finally:
            browser.close()


def _wait_for_kernel(page: sync_api.Page, lab: Lab, name: str) -> None:
    """Until the notebook's kernel is up and idle (Run All before that asks which kernel to start)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sessions = lab.api("GET", "sessions") or []
        states = [s["kernel"]["execution_state"] for s in sessions if s.get("path", "").endswith(name)]  # type: ignore[union-attr]
        if states == ["idle"]:
            break
        time.sleep(0.2)
    else:
        raise TimeoutError(f"the kernel of {name} did not start within 60 s")
    page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']")
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and dialog.get_by_text("Select Kernel").count():
        dialog.get_by_role("button", name="Select").click()


def _check_live_view(page: sync_api.Page, shots: Path) -> None:
    launch = page.locator(".nbaccel-launch")
    launch.wait_for(state="visible")
    tabs = launch.locator(".lm-TabBar-tab")
    page.wait_for_function(
        "() => document.querySelectorAll('.nbaccel-launch .lm-TabBar-tab').length === 2"
        " && [...document.querySelectorAll('.nbaccel-launch .lm-TabBar-tab')].every(t => t.textContent.includes('running'))"
    )
    assert [t.strip() for t in tabs.all_inner_texts()] == ["rank 0 · running", "rank 1 · running"]
    assert "lm-mod-current" in (tabs.nth(0).get_attribute("class") or "")
    assert "lm-mod-current" not in (tabs.nth(1).get_attribute("class") or "")
    panel = launch.locator(".nbaccel-rank-panel").first
    panel.get_by_text("tick 10 on rank 0").wait_for(state="visible")
    assert page.locator(".jp-Cell").nth(1).locator(".jp-InputPrompt").inner_text().strip() == "[*]:", "the cell must still be running"
    assert launch.locator(".nbaccel-progress").first.is_visible()
    assert "rank 0 · running" in launch.inner_text()  # the chips say it in words
    # The kernel samples each rank once a second: its chip says its CPU use and memory, live.
    page.wait_for_function("() => document.querySelectorAll('.nbaccel-launch .nbaccel-chips .nbaccel-resources').length === 2")
    for use in launch.locator(".nbaccel-chips .nbaccel-resources").all_inner_texts():
        assert use.startswith("· cpu ") and ("MiB" in use or "GiB" in use), use
    page.screenshot(path=str(shots / "live.png"))
    tabs.nth(1).click()
    launch.locator(".nbaccel-rank-panel").nth(1).get_by_text("tick 10 on rank 1").wait_for(state="visible")
    tabs.nth(0).click()


def _check_end_view(page: sync_api.Page, shots: Path) -> None:
    static = page.locator(".nbaccel-launch-static")
    static.wait_for(state="visible")
    summaries = [s.strip() for s in static.locator("details > summary").all_inner_texts()]
    assert summaries == ["rank 0 · stopped", "✗ rank 1 · failed (ValueError)"]
    assert static.locator("details").nth(0).get_attribute("open") is not None  # rank 0 is always open
    assert static.locator("details").nth(1).get_attribute("open") is not None  # an error is never folded away
    assert "rank 1 failed: ValueError: rank 1 broke" in static.inner_text()
    assert [u.split(" peak ")[0] for u in static.locator(".nbaccel-resources").all_inner_texts()] == ["·", "·"]  # each rank's peak
    error = page.locator(".jp-Cell").nth(1).locator("[data-mime-type='application/vnd.jupyter.stderr']")
    error.last.wait_for(state="visible")
    assert "rank 1" in error.last.inner_text()
    page.locator(".jp-Cell").nth(1).scroll_into_view_if_needed()
    page.screenshot(path=str(shots / "end.png"), full_page=True)


def _check_saved_notebook(page: sync_api.Page, path: Path) -> None:
    page.keyboard.press("Control+s")
    deadline = time.monotonic() + 20
    outputs: list = []
    while time.monotonic() < deadline:
        outputs = nbformat.read(path, as_version=4).cells[1].get("outputs", [])
        if any("text/html" in o.get("data", {}) for o in outputs):
            break
        time.sleep(0.2)
    (view,) = [o for o in outputs if o.get("output_type") == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" not in view["data"]
    plain = view["data"]["text/plain"]
    assert plain.index("── rank 0 · stopped") < plain.index("── rank 1 · failed (ValueError)")
    assert "tick 25 on rank 0" in plain
