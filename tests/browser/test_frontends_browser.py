"""The live view where Tab titles are not drawn (VS Code), and in the classic Notebook, in Chromium.

1. JupyterLab 4 with the Tab titles hidden by CSS, as VS Code's renderer leaves them (ipywidgets
   #3657): each rank's panel must still say whose it is and in what state, and the chip row
   every rank's state, in the page's own visible text.
2. The classic Notebook (nbclassic, with ipywidgets' widgetsnbextension), nbaccel loaded at
   kernel start (IPython's ``extensions``, the way its detection works there): a 2-rank
   ``%%distributed`` shows both ranks live and labelled, rank 0 first, and the saved notebook
   keeps the final static view.

Ranks wait for a file the test writes once it has read the live view: no timing races.
Needs: ``scripts/install-browser-deps.sh`` (chromium, jupyterlab, nbclassic, playwright).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.browser.jupyterlab_server import CHROMIUM, CHROMIUM_ARGS, Lab, jupyterlab

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180), pytest.mark.orphans]

if not Path(CHROMIUM).exists():
    pytest.skip(f"{CHROMIUM} is missing; run scripts/install-browser-deps.sh to install Debian's chromium", allow_module_level=True)
nbformat = pytest.importorskip("nbformat")
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed; run scripts/install-browser-deps.sh")

from tests.browser.test_jupyterlab import _quiet_settings, _wait_for_kernel  # noqa: E402 - after the skips above

HIDE_TAB_TITLES = ".lm-TabBar-tabLabel, .p-TabBar-tabLabel { display: none !important; }"


def _cell(ranks: int, release: Path) -> str:
    return f"""%%distributed -n {ranks}
import os, time
rank = state.process_index
i = 0
while not os.path.exists({str(release)!r}):
    print(f"tick {{i}} on rank {{rank}}", flush=True)
    i += 1
    time.sleep(0.2)
print(f"released rank {{rank}}", flush=True)
"""


def _notebook(root: Path, cells: list[str]) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    path = root / "frontends.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("NBACCEL_SCREENSHOTS") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


def _env(root: Path) -> dict[str, str]:
    return {"NBACCEL_OUTPUT": "", "NBACCEL_LOG_DIR": str(root / ".home" / "logs")}


def test_without_tab_titles_every_ranks_panel_says_its_rank_and_state(tmp_path: Path, browser: sync_api.Browser, shots: Path) -> None:
    _quiet_settings(tmp_path)
    release = tmp_path / "release"
    path = _notebook(tmp_path, ["%load_ext nbaccel", _cell(3, release)])
    with jupyterlab(tmp_path, env=_env(tmp_path)) as lab:
        page = browser.new_page(viewport={"width": 1200, "height": 950})
        page.set_default_timeout(60_000)
        try:
            page.goto(lab.url(f"lab/tree/{path.name}"))
            _wait_for_kernel(page, lab, path.name)
            page.add_style_tag(content=HIDE_TAB_TITLES)
            page.get_by_role("menuitem", name="Run").click()
            page.get_by_text("Run All Cells", exact=True).click()
            launch = page.locator(".nbaccel-launch")
            launch.wait_for(state="visible")
            tabs = launch.locator(".lm-TabBar-tab")
            page.wait_for_function("() => document.querySelectorAll('.nbaccel-launch .lm-TabBar-tab').length === 3")
            assert [t.strip() for t in tabs.all_inner_texts()] == ["", "", ""]  # as in VS Code: no titles to read
            chips = launch.locator(".nbaccel-chips")
            page.wait_for_function("() => (document.querySelector('.nbaccel-launch .nbaccel-chips')?.innerText.match(/running/g) || []).length === 3")
            assert all(f"rank {r} · running" in chips.inner_text() for r in range(3))
            for rank in range(3):
                tabs.nth(rank).click()
                header = launch.locator(".nbaccel-rank-panel:visible .nbaccel-rank-header")
                header.get_by_text(f"rank {rank} · running").wait_for(state="visible")
                launch.locator(".nbaccel-rank-panel:visible").get_by_text(f"tick 2 on rank {rank}").wait_for(state="visible")
                assert header.count() == 1
            page.screenshot(path=str(shots / "no-tab-titles.png"))
            release.touch()
            static = page.locator(".nbaccel-launch-static")
            static.wait_for(state="visible")
            assert [s.strip() for s in static.locator("details > summary").all_inner_texts()] == [f"rank {r} · done" for r in range(3)]
        except Exception:
            page.screenshot(path=str(shots / "no-tab-titles-failure.png"), full_page=True)
            raise


def _classic_kernel_loads_nbaccel(root: Path) -> None:
    """IPython config for the server's kernels: ``%load_ext nbaccel`` before the first cell."""
    profile = root / ".home" / "ipython" / "profile_default"
    profile.mkdir(parents=True, exist_ok=True)
    (profile / "ipython_kernel_config.py").write_text('c.InteractiveShellApp.extensions = ["nbaccel"]\n')


def test_the_classic_notebook_shows_both_ranks_live_labelled_and_keeps_the_final_view(tmp_path: Path, browser: sync_api.Browser, shots: Path) -> None:
    pytest.importorskip("nbclassic", reason="nbclassic is not installed; run scripts/install-browser-deps.sh")
    _classic_kernel_loads_nbaccel(tmp_path)
    release = tmp_path / "release"
    path = _notebook(tmp_path, ["from nbaccel.output.frontend import detect; print(detect().name)", _cell(2, release)])
    with jupyterlab(tmp_path, env=_env(tmp_path), app="nbclassic") as lab:
        page = browser.new_page(viewport={"width": 1200, "height": 950})
        page.set_default_timeout(60_000)
        try:
            page.goto(lab.url(f"nbclassic/notebooks/{path.name}"))  # Notebook 7 owns /notebooks
            page.wait_for_function("() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel && Jupyter.notebook.kernel.is_connected()")
            _wait_idle(lab, path.name)
            page.evaluate("() => Jupyter.notebook.execute_all_cells()")
            page.locator(".cell").nth(0).locator(".output_area").get_by_text("classic").wait_for(state="visible")
            launch = page.locator(".nbaccel-launch")
            launch.wait_for(state="visible")
            header = launch.locator(".nbaccel-rank-panel:visible .nbaccel-rank-header")
            header.get_by_text("rank 0 · running").wait_for(state="visible")  # rank 0's panel is the one shown first
            launch.locator(".nbaccel-rank-panel:visible").get_by_text("tick 2 on rank 0").wait_for(state="visible")
            tabs = launch.locator(".lm-TabBar-tab, .p-TabBar-tab")
            assert [t.strip() for t in tabs.all_inner_texts()] == ["rank 0 · running", "rank 1 · running"]
            tabs.nth(1).click()
            header.get_by_text("rank 1 · running").wait_for(state="visible")
            launch.locator(".nbaccel-rank-panel:visible").get_by_text("tick 2 on rank 1").wait_for(state="visible")
            page.screenshot(path=str(shots / "classic-live.png"))
            release.touch()
            static = page.locator(".nbaccel-launch-static")
            static.wait_for(state="visible")
            assert [s.strip() for s in static.locator("details > summary").all_inner_texts()] == ["rank 0 · done", "rank 1 · done"]
            _wait_idle(lab, path.name)
            page.evaluate("() => Jupyter.notebook.save_notebook()")
            _check_saved(path)
        except Exception:
            page.screenshot(path=str(shots / "classic-failure.png"), full_page=True)
            raise


def _wait_idle(lab: Lab, name: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        sessions = lab.api("GET", "sessions") or []
        if [s["kernel"]["execution_state"] for s in sessions if s.get("path", "").endswith(name)] == ["idle"]:  # type: ignore[union-attr]
            return
        time.sleep(0.2)
    raise TimeoutError(f"the kernel of {name} did not become idle within 60 s")


def _check_saved(path: Path) -> None:
    deadline = time.monotonic() + 20
    views: list[dict[str, object]] = []
    while time.monotonic() < deadline and not views:
        outputs = nbformat.read(path, as_version=4).cells[1].get("outputs", [])
        views = [o for o in outputs if o.get("output_type") == "display_data" and "text/html" in o.get("data", {})]
        time.sleep(0.2)
    (view,) = views
    data = view["data"]
    assert isinstance(data, dict) and "application/vnd.jupyter.widget-view+json" not in data
    plain = data["text/plain"]
    assert plain.index("── rank 0 · done") < plain.index("── rank 1 · done") and "released rank 1" in plain
