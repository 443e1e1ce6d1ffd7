"""A real, test-configured IPython shell with nbaccel loaded, and a stand-in launcher."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

import nbaccel.launcher


@pytest.fixture(scope="module")
def ip(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InteractiveShell]:
    """``InteractiveShell.instance()`` with history in memory (no saving thread) and ``%load_ext nbaccel``."""
    saved = os.environ.get("IPYTHONDIR")
    os.environ["IPYTHONDIR"] = str(tmp_path_factory.mktemp("ipython"))
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    config.InteractiveShell.colors = "nocolor"
    shell = InteractiveShell.instance(config=config)
    shell.run_line_magic("load_ext", "nbaccel")
    try:
        yield shell
    finally:
        shell.run_line_magic("unload_ext", "nbaccel")
        InteractiveShell.clear_instance()
        if saved is None:
            os.environ.pop("IPYTHONDIR", None)
        else:
            os.environ["IPYTHONDIR"] = saved


class Launches(list):
    """Every call the magic made to notebook_launcher: (cell function, keyword arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.raises: BaseException | None = None

    @property
    def kwargs(self) -> dict[str, Any]:
        assert len(self) == 1, f"expected one launch, got {len(self)}"
        return self[0][1]


@pytest.fixture
def launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    """Replace notebook_launcher: rank 0 runs the cell in this process, "rank 1" returns a marker."""
    calls = Launches()

    def fake_launcher(function: Any, **kwargs: Any) -> list[Any]:
        calls.append((function, kwargs))
        if calls.raises is not None:
            raise calls.raises
        return [function(), "rank 1"]

    monkeypatch.setattr(nbaccel.launcher, "notebook_launcher", fake_launcher)
    return calls
