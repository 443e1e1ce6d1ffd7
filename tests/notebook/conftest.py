"""A real, test-configured IPython shell with nbaccel loaded, and stand-ins handed to its magics.

``ip`` has nbaccel's real magics (a real launch forks). ``launches`` / ``started`` register the
magics again with stand-ins through their seams (tests/notebook/stand_ins.py): a one-shot cell
runs rank 0 in this process, workers live in this process; the real magics come back after.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from nbaccel.notebook.magics import DistributedMagics, register
from tests.notebook.stand_ins import FakePool, Launches, Starts


@pytest.fixture(scope="module")
def ip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    """``InteractiveShell.instance()`` with history in memory (no saving thread) and ``%load_ext nbaccel``."""
    saved = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(tmp_path_factory.mktemp("ipython"))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "nocolor"
    shell = InteractiveShell.instance(config=config)
    # %load_ext forks nbaccel's fork server (and forks it again after cells): in this test process
    # each would be a process some test left behind. The server's own tests start it themselves.
    saved_server = os.environ.get("NBACCEL_FORK_SERVER")
    os.environ["NBACCEL_FORK_SERVER"] = "lazy"
    shell.run_line_magic("load_ext", "nbaccel")
    try:
        yield shell
    finally:
        shell.run_line_magic("unload_ext", "nbaccel")
        InteractiveShell.clear_instance()
        if saved_server is None:
            os.environ.pop("NBACCEL_FORK_SERVER", None)
        else:
            os.environ["NBACCEL_FORK_SERVER"] = saved_server
        if saved is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = saved


@pytest.fixture
def stand_ins(ip: InteractiveShell) -> Iterator[tuple[Launches, Starts]]:
    """The magics, registered with a stand-in launcher and pool; the real magics again afterwards."""
    launches, starts = Launches(), Starts()
    register(ip, launch=launches, start_pool=starts)
    yield launches, starts
    if "nbaccel" in ip.extension_manager.loaded:
        register(ip)  # nbaccel's own launcher and pool (stops the stand-in workers)


@pytest.fixture
def launches(stand_ins: tuple[Launches, Starts]) -> Launches:
    """Every one-shot launch the magic made (rank 0 ran the cell here)."""
    return stand_ins[0]


@pytest.fixture
def started(stand_ins: tuple[Launches, Starts]) -> Starts:
    """Every pool ``%distributed start`` made (FakePool)."""
    return stand_ins[1]


@pytest.fixture
def pool(ip: InteractiveShell, started: Starts) -> FakePool:
    """Two stand-in workers, started with ``%distributed start -n 2``."""
    ip.run_line_magic("distributed", "start -n 2")
    return started[0]


def magics_of(ip: InteractiveShell) -> DistributedMagics:
    """The magics instance the shell runs ``%%distributed`` with."""
    magics = ip.magics_manager.registry[DistributedMagics.__name__]
    assert isinstance(magics, DistributedMagics)
    return magics
