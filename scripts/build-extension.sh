#!/usr/bin/env bash
# Build nbaccel's JupyterLab extension (extension/ -> nbaccel/labextension); safe to run again.
#
#   scripts/build-extension.sh [--venv VENV] [--test] [--link] [--dist DIR]
#
#   --venv VENV   take jlpm and python from VENV (default: PATH)
#   --test        also lint it (jlpm lint:check: Prettier and ESLint) and run its jest tests
#                 with coverage (jlpm test; the report is printed, lcov in extension/coverage/)
#   --link        make VENV's JupyterLab and Notebook 7 load this build: link it where the
#                 wheel's shared-data puts it (VENV/share/jupyter/labextensions/nbaccel), as
#                 `jupyter labextension develop` would; an editable nbaccel stays editable
#   --dist DIR    build the wheel and the sdist into DIR and check their contents
#                 (scripts/check_dist.py: the labextension inside, no node_modules/.yarn)
#
# Needs Node >= 20.19 (Rspack) and `jlpm` (the jupyter-builder Python package, a dependency of
# jupyterlab). A cold `jlpm install` takes 1-2 min; later runs take seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
run_tests=0 link=0 venv="" dist=""
while [[ $# -gt 0 ]]; do
    case "$1" in
        --test) run_tests=1; shift ;;
        --venv) venv=$2; shift 2 ;;
        --link) link=1; shift ;;
        --dist) dist=$2; shift 2 ;;
        *) echo "build-extension: unknown argument $1; usage: $0 [--venv VENV] [--test] [--link] [--dist DIR]" >&2; exit 2 ;;
    esac
done

if [[ -n "$venv" ]]; then venv=$(cd "$venv" && pwd); fi  # absolute: the build runs inside extension/
python=${venv:+$venv/bin/python}
python=${python:-python3}
jlpm=$(command -v "${venv:+$venv/bin/}jlpm" || command -v jlpm || true)
if [[ -z "$jlpm" ]]; then
    echo "build-extension: no jlpm found (it comes with the jupyter-builder package); pip install 'jupyter-builder>=1.2,<2' into ${venv:-your environment}" >&2
    exit 2
fi
export PATH="$(dirname "$jlpm"):$PATH"  # package.json's scripts call jlpm and jupyter-builder
node_version=$(node --version 2>/dev/null || true)
if [[ ! "$node_version" =~ ^v(2[0-9]|[3-9][0-9])\. ]]; then
    echo "build-extension: needs Node >= 20.19 (found ${node_version:-none}); install Node 20 or 22 (Debian's nodejs 18 is too old for Rspack)" >&2
    exit 2
fi

cd extension
"$jlpm" install --immutable
"$jlpm" build:prod
if [[ $run_tests == 1 ]]; then
    "$jlpm" lint:check
    "$jlpm" test --silent
fi
cd "$root"

if [[ $link == 1 ]]; then
    [[ -n "$venv" ]] || { echo "build-extension: --link needs --venv VENV" >&2; exit 2; }
    target="$venv/share/jupyter/labextensions/nbaccel"
    rm -rf "$target" && mkdir -p "$target"
    ln -s "$root/nbaccel/labextension/package.json" "$target/package.json"
    ln -s "$root/nbaccel/labextension/static" "$target/static"
    ln -s "$root/extension/install.json" "$target/install.json"
    echo "build-extension: $target now serves this build"
fi

if [[ -n "$dist" ]]; then
    mkdir -p "$dist"
    rm -f "$dist"/nbaccel-*.whl "$dist"/nbaccel-*.tar.gz
    "$python" -m build --wheel --sdist --outdir "$dist" .
    "$python" scripts/check_dist.py "$dist"/nbaccel-*.whl "$dist"/nbaccel-*.tar.gz
fi
