"""A rank from the fork server sees what the kernel imported since the server started, as a forked rank does.

A module next to the notebook, and a plugin imported only for its side effect (it registers a
codec), are imported in the kernel after its fork server started; the server's ranks import them
by name before the function runs. A real fork server, real ranks.

Imports internals (launch): the server is started and the kernel marked unsafe directly.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import nbaccel
from nbaccel.launch import fork_server
from nbaccel.testing import mark_fork_safe, mark_not_fork_safe

pytestmark = pytest.mark.timeout(120)

PLUGIN = """
import codecs

def _find(name):
    if name == "nbacceltestrot13":
        return codecs.lookup("rot13")
    return None

codecs.register(_find)  # what a plugin does on import: register itself, export nothing needed
"""


@pytest.fixture
def notebook_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on sys.path (as the notebook's is in a kernel), holding two modules not imported yet."""
    (tmp_path / "nb_helper_mod.py").write_text("ANSWER = 42\n")
    (tmp_path / "nb_codec_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    for name in ("nb_helper_mod", "nb_codec_plugin"):
        sys.modules.pop(name, None)


@pytest.fixture
def server_then_unsafe(notebook_folder: Path) -> Iterator[fork_server.ForkServer]:
    fork_server.shutdown()
    server = fork_server.fork_server()  # started before the kernel imports the modules
    try:
        yield server
    finally:
        mark_fork_safe()
        fork_server.shutdown()


def what_the_rank_sees() -> tuple[bool, bool]:
    import codecs

    try:
        codecs.lookup("nbacceltestrot13")
        registered = True
    except LookupError:
        registered = False
    return "nb_helper_mod" in sys.modules, registered


def test_modules_the_kernel_imported_after_the_server_started_are_in_its_ranks(server_then_unsafe: fork_server.ForkServer) -> None:
    importlib.import_module("nb_helper_mod")
    importlib.import_module("nb_codec_plugin")  # imported only for its side effect
    mark_not_fork_safe("CUDA is initialised (pretend)")  # as on Kaggle or Colab: the ranks come from the server
    assert nbaccel.notebook_launcher(what_the_rank_sees, num_processes=2) == [(True, True), (True, True)]
    assert fork_server.running_server() is server_then_unsafe  # the same server, started before the imports


def test_a_module_that_fails_in_the_rank_does_not_stop_it(server_then_unsafe: fork_server.ForkServer, notebook_folder: Path) -> None:
    importlib.import_module("nb_helper_mod")
    (notebook_folder / "nb_helper_mod.py").write_text("raise ImportError('gone since')\n")  # the rank's import of it fails
    sys.modules["nb_fake_dynamic"] = type(sys)("nb_fake_dynamic")  # no spec: cannot be imported by name, is skipped
    try:
        assert nbaccel.notebook_launcher(lambda: 7, num_processes=1, start_method="forkserver") == [7]
    finally:
        sys.modules.pop("nb_fake_dynamic", None)
