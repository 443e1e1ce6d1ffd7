"""Is a frontend that renders widgets attached to this kernel? (``output="auto"`` asks this.)

What a frontend leaves behind in the kernel, strongest evidence first:

1. JupyterLab 4 and Notebook 7 (ipywidgets 8's widget manager, also in VS Code) open a comm on
   ``jupyter.widget.control`` *as soon as they connect to the kernel* and ask it for the widget
   states. ``watch()`` registers for that target (handing the comm on to ipywidgets, so widget
   restore keeps working), and ipywidgets records it too (``Widget._control_comm``). Seen:
   widgets.
2. That open happens before any cell runs, so a watcher installed by the first cell
   (``%load_ext nbaccel``) has missed it. Only a watcher installed while the kernel started
   (IPython config ``extensions = ["nbaccel"]``) can tell that no widget frontend came: then
   its silence means text.
3. Otherwise: the cell's ``execute_request`` metadata. JupyterLab's and Notebook 7's notebooks
   send ``deletedCells`` and ``recordTiming`` with every cell; nbclient, nbconvert, jupyter
   console and a bare jupyter_client do not. Such a notebook is assumed to render widgets
   (ipywidgets 8, an nbaccel dependency, brings ``jupyterlab_widgets``); if it cannot, the
   widget's text fallback shows until the static view replaces it at the end.
   VS Code's notebooks and interactive window (whose widget manager renders ipywidgets 8) send
   ``cellId`` with every cell: the URI of the cell's document, ``vscode-notebook-cell:...``
   (vscode-jupyter's ``cellExecution.ts``). JupyterLab's ``cellId`` is an nbformat cell id and
   nbclient's none, so the scheme tells VS Code apart. Its environment (``VSCODE_PID``, ...) does
   not: a kernel started by ``jupyter notebook`` in VS Code's terminal has it too, and a kernel
   on a remote Jupyter server that VS Code connects to has none.

Beyond "widgets or not", ``detect()`` names the frontend, because renderers differ in how many
widget messages they take (``nbaccel.output.update_policy`` holds the rate each one gets):

- VS Code: the ``vscode-notebook-cell:`` cell id above; ``VSCODE_PID`` only as a weak hint, for a
  widget frontend seen through the control comm (panel #5200: the variable alone is unreliable);
- Colab: its kernel imports ``google.colab`` before the first cell;
- Kaggle: its kernels carry ``KAGGLE_KERNEL_RUN_TYPE`` (``Interactive`` in the editor, ``Batch``
  for a "Save & Run All" commit, which nobody watches: text) and ``KAGGLE_URL_BASE``;
- JupyterLab 4 and Notebook 7 (the same notebook code): their cell metadata;
- the classic Notebook (nbclassic, Notebook 6): its widget manager opens the control comm but its
  cells carry no metadata at all, so it is told only by a watcher installed at kernel start;
  loaded by a cell, it looks like nbclient and gets text (``--widgets`` asks for the view).

Anything else (no kernel: terminal IPython, plain Python; or a frontend nbaccel does not know)
means text, labelled by rank.

Example:
    >>> widget_frontend_attached()  # plain Python: no kernel, so no widgets
    False
    >>> detect().name, detect().widgets
    ('none', False)
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

CONTROL_TARGET = "jupyter.widget.control"
_JUPYTERLAB_CELL_KEYS = ("deletedCells", "recordTiming")
_VSCODE_CELL_SCHEMES = ("vscode-notebook-cell:", "vscode-interactive")

VSCODE, COLAB, KAGGLE, JUPYTERLAB, CLASSIC, NONE = "vscode", "colab", "kaggle", "jupyterlab", "classic", "none"
FRONTENDS = (VSCODE, COLAB, KAGGLE, JUPYTERLAB, CLASSIC, NONE)
KAGGLE_VARIABLES = ("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE")


@dataclass(frozen=True)
class Frontend:
    """What runs this cell: ``name`` (one of ``FRONTENDS``), whether it renders ipywidgets, and why
    nbaccel thinks so (``evidence``, in words)."""

    name: str
    widgets: bool
    evidence: str


_state: dict[str, Any] = {"seen": False, "since_start": False, "manager": None, "handler": None}


def watch(shell: Any = None) -> bool:
    """Listen for widget frontends from now on (idempotent); False where there is no kernel."""
    kernel = _kernel(shell)
    manager = getattr(kernel, "comm_manager", None)
    if manager is None or not hasattr(manager, "register_target"):
        return False
    targets = getattr(manager, "targets", {})
    current = targets.get(CONTROL_TARGET)
    if current is not None and current is _state["handler"]:
        return True
    first = _state["manager"] is not manager
    previous = current

    def on_control_open(comm: Any, msg: dict[str, Any]) -> None:
        _state["seen"] = True
        handler = previous if previous is not None else _ipywidgets_handler()
        handler(comm, msg)

    manager.register_target(CONTROL_TARGET, on_control_open)
    _state["handler"] = on_control_open
    if first:
        _state["manager"] = manager
        _state["since_start"] = not _current_parent(kernel).get("header")
    return True


def widget_frontend_attached(shell: Any = None) -> bool:
    """True when the frontend running this cell can show ipywidgets (see the module doc)."""
    return detect(shell).widgets


def detect(shell: Any = None, environ: Any = None) -> Frontend:
    """The frontend running this cell, strongest evidence first (see the module doc).

    ``environ`` (default ``os.environ``) is where Kaggle's and VS Code's variables are read.
    """
    env = os.environ if environ is None else environ
    kernel = _kernel(shell)
    if kernel is None:
        return Frontend(NONE, False, "no Jupyter kernel (terminal IPython or plain Python)")
    watch(shell)  # re-register if importing ipywidgets replaced our handler
    metadata = _current_parent(kernel).get("metadata") or {}
    if _sent_by_vscode(metadata):
        return Frontend(VSCODE, True, f"the cell's id is a VS Code cell URI ({str(metadata['cellId']).split(':')[0]}:)")
    if "google.colab" in sys.modules:
        return Frontend(COLAB, True, "google.colab is imported (Colab's kernel)")
    kaggle = _kaggle(env)
    if kaggle is not None:
        return kaggle
    lab_cell = any(key in metadata for key in _JUPYTERLAB_CELL_KEYS)
    if _state["seen"] or _ipywidgets_saw_control_comm():
        if lab_cell:
            return Frontend(JUPYTERLAB, True, "a widget manager opened the control comm; the cell carries JupyterLab's metadata")
        if env.get("VSCODE_PID"):
            return Frontend(VSCODE, True, "a widget manager opened the control comm, and VSCODE_PID is set")
        return Frontend(CLASSIC, True, "a widget manager opened the control comm; the cell carries no metadata (classic Notebook)")
    if _state["since_start"]:
        return Frontend(NONE, False, "no widget manager opened the control comm since the kernel started")
    if lab_cell:
        return Frontend(JUPYTERLAB, True, "the cell carries JupyterLab's metadata (deletedCells, recordTiming)")
    return Frontend(NONE, False, "no widget frontend recognised (nbclient, papermill, jupyter console, or an unknown frontend)")


def _kaggle(env: Any) -> Frontend | None:
    """Kaggle's kernels, by their variables: the editor renders widgets, a commit run does not."""
    present = [name for name in KAGGLE_VARIABLES if env.get(name)]
    if not present:
        return None
    run_type = env.get("KAGGLE_KERNEL_RUN_TYPE", "")
    if run_type == "Batch":
        return Frontend(KAGGLE, False, "KAGGLE_KERNEL_RUN_TYPE=Batch (a commit run: nobody watches it)")
    return Frontend(KAGGLE, True, f"{present[0]} is set (Kaggle's notebook editor)")


def _sent_by_vscode(metadata: dict[str, Any]) -> bool:
    """The cell came from a VS Code notebook: its ``cellId`` is the cell document's URI."""
    cell_id = metadata.get("cellId")
    return isinstance(cell_id, str) and cell_id.startswith(_VSCODE_CELL_SCHEMES)


def in_kernel(shell: Any = None) -> bool:
    """True inside a Jupyter kernel (ipykernel), where widgets and display messages can be sent."""
    return _kernel(shell) is not None


def _kernel(shell: Any) -> Any:
    if shell is None:
        if "IPython" not in sys.modules:
            return None
        from IPython import get_ipython

        shell = get_ipython()
    return getattr(shell, "kernel", None) if shell is not None else None


def _current_parent(kernel: Any) -> dict[str, Any]:
    """The message of the request being handled (the cell's execute_request), or {}."""
    get_parent = getattr(kernel, "get_parent", None)
    try:
        parent = get_parent() if get_parent is not None else {}
    except Exception:  # noqa: BLE001 - older ipykernel signatures: treat as "unknown"
        parent = {}
    return parent if isinstance(parent, dict) else {}


def _ipywidgets_handler() -> Any:
    from ipywidgets import Widget

    return Widget.handle_control_comm_opened


def _ipywidgets_saw_control_comm() -> bool:
    module = sys.modules.get("ipywidgets.widgets.widget")
    return module is not None and getattr(module.Widget, "_control_comm", None) is not None


def reset_for_tests() -> None:
    """Forget what was seen (tests only)."""
    _state.update(seen=False, since_start=False, manager=None, handler=None)
