#!/usr/bin/env bash
# Install what the browser tests (tests/browser, marker `browser`) need; safe to run again.
#
#   scripts/install-browser-deps.sh [VENV]     (VENV defaults to ./.venv)
#
# - Debian's chromium (Playwright's own browser download is not reachable from CI machines):
#   installed with apt-get only when /usr/bin/chromium is missing (needs root or sudo).
# - jupyterlab, notebook (7), nbclassic (the classic Notebook, with ipywidgets' widgetsnbextension)
#   and playwright (the Python driver only; no `playwright install`) into VENV.
# - the npm packages of tests/browser/package.json (ipywidgets' html manager; VS Code's widget
#   renderer and the kernel connection its bridge page bundles), where npm is installed, from its
#   lock file (`npm ci`), then the bridge page's script (`npm run build`).
set -euo pipefail

venv="${1:-.venv}"
python="$venv/bin/python"
if [[ ! -x "$python" ]]; then
    echo "install-browser-deps: no Python at $python; pass the virtual environment's folder, e.g. $0 .venv" >&2
    exit 2
fi

if [[ ! -x /usr/bin/chromium ]]; then
    sudo=""
    if [[ "$(id -u)" != 0 ]]; then
        command -v sudo >/dev/null || { echo "install-browser-deps: /usr/bin/chromium is missing and apt-get needs root; run as root or install sudo" >&2; exit 2; }
        sudo="sudo"
    fi
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends chromium fonts-dejavu-core
fi

constraints=()
here="$(cd "$(dirname "$0")/.." && pwd)"
if [[ -f "$here/constraints.txt" ]]; then
    constraints=(-c "$here/constraints.txt")
fi
"$python" -m pip install -q "${constraints[@]}" jupyterlab notebook nbclassic widgetsnbextension playwright
"$python" - <<'PY'
import jupyterlab, notebook, nbclassic, playwright
from importlib.metadata import version
print(f"install-browser-deps: jupyterlab {version('jupyterlab')}, notebook {version('notebook')}, nbclassic {version('nbclassic')}, playwright {version('playwright')}, chromium at /usr/bin/chromium")
PY
if [[ -f "$here/tests/browser/package.json" ]]; then
    if command -v npm >/dev/null; then
        (cd "$here/tests/browser" && npm ci --no-audit --no-fund --silent && npm run --silent build)
        echo "install-browser-deps: npm packages of tests/browser installed, the VS Code bridge page built"
    else
        echo "install-browser-deps: npm is missing; the html-manager and VS Code renderer browser tests will skip" >&2
    fi
fi
