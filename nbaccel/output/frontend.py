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

Anything else (no kernel: terminal IPython, plain Python) means text.

Example:
    >>> widget_frontend_attached()  # plain Python: no kernel, so no widgets
    False
"""

from __future__ import annotations

import sys
from typing import Any

CONTROL_TARGET = "jupyter.widget.control"
_JUPYTERLAB_CELL_KEYS = ("deletedCells", "recordTiming")
_VSCODE_CELL_SCHEMES = ("vscode-notebook-cell:", "vscode-interactive")

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
    kernel = _kernel(shell)
    if kernel is None:
        return False
    watch(shell)  # re-register if importing ipywidgets replaced our handler
    if _state["seen"] or _ipywidgets_saw_control_comm():
        return True
    if _state["since_start"]:
        return False
    metadata = _current_parent(kernel).get("metadata") or {}
    return any(key in metadata for key in _JUPYTERLAB_CELL_KEYS) or _sent_by_vscode(metadata)


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
