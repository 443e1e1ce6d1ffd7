"""nbaccel: run distributed PyTorch from a Jupyter notebook.

One process per GPU (two gloo processes on a CPU-only machine), forked from the running kernel,
with every rank's output relayed live and every rank's result brought back.

Example:
    >>> import nbaccel
    >>> def square_of_rank():
    ...     state = nbaccel.PartialState()
    ...     return state.process_index ** 2
    >>> nbaccel.notebook_launcher(square_of_rank, num_processes=2)
    [0, 1]

In IPython, ``%load_ext nbaccel`` adds the ``%%distributed`` cell magic.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

from nbaccel._version import __version__

# torch.cuda.is_available() (the first line of nearly every notebook) runs cuInit in the kernel
# unless this is set, without setting torch's own "initialised" flag, and a kernel that ran
# cuInit can no longer fork ranks that use CUDA. With it, torch asks NVML instead and leaves the
# driver untouched. setdefault: a user's explicit "0" is kept (nbaccel then sees the driver's
# state itself and starts the ranks by spawn). Read by torch at each call, so setting it after
# torch was imported still works.
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

if TYPE_CHECKING:
    from nbaccel.cluster.cluster import Cluster
    from nbaccel.cluster.failures import NodeRankFailedError
    from nbaccel.errors import CheckpointError, LaunchTimeoutError, NbaccelError, PreflightError, RankFailedError
    from nbaccel.launch.preview import LaunchPreview
    from nbaccel.launcher import notebook_launcher, plan, start_workers
    from nbaccel.pool import PoolStoppedError, WorkerPool
    from nbaccel.state import (
        AcceleratorState,
        DistributedType,
        GradientAccumulationPlugin,
        GradientState,
        InitProcessGroupKwargs,
        PartialState,
    )
    from nbaccel.state.data import accumulate, prepare_data_loader

# Public name -> module that defines it. Imported on first use so that `import nbaccel` (and
# `%load_ext nbaccel`) stays cheap and never touches CUDA.
_EXPORTS = {
    "notebook_launcher": "launcher",
    "plan": "launcher",
    "LaunchPreview": "launch.preview",
    "Cluster": "cluster.cluster",
    "start_workers": "launcher",
    "WorkerPool": "pool",
    "PoolStoppedError": "pool",
    "NbaccelError": "errors",
    "CheckpointError": "errors",
    "PreflightError": "errors",
    "RankFailedError": "errors",
    "NodeRankFailedError": "cluster.failures",
    "LaunchTimeoutError": "errors",
    "PartialState": "state",
    "AcceleratorState": "state",
    "GradientState": "state",
    "GradientAccumulationPlugin": "state",
    "DistributedType": "state",
    "InitProcessGroupKwargs": "state",
    "prepare_data_loader": "state.data",
    "accumulate": "state.data",
}

__all__ = [  # spelled out (not built from _EXPORTS) so static tools see the public names
    "AcceleratorState",
    "CheckpointError",
    "Cluster",
    "DistributedType",
    "GradientAccumulationPlugin",
    "GradientState",
    "InitProcessGroupKwargs",
    "LaunchPreview",
    "LaunchTimeoutError",
    "NbaccelError",
    "NodeRankFailedError",
    "PartialState",
    "PoolStoppedError",
    "PreflightError",
    "RankFailedError",
    "WorkerPool",
    "__version__",
    "accumulate",
    "load_ipython_extension",
    "notebook_launcher",
    "plan",
    "prepare_data_loader",
    "start_workers",
    "unload_ipython_extension",
]
assert set(__all__) >= set(_EXPORTS), "every lazily exported name is public"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'nbaccel' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext nbaccel``: registers the ``%%distributed`` magics."""
    _start_fork_server()
    from nbaccel.notebook.magics import register
    from nbaccel.notebook.workers_comm import attach
    from nbaccel.output.frontend import watch

    watch(ipython)  # from now on, notice widget frontends that (re)connect
    register(ipython)
    attach(ipython)  # the JupyterLab extension's workers panel (inert without it)


def unload_ipython_extension(ipython: Any) -> None:
    """Called by ``%unload_ext nbaccel``: removes the magics again."""
    from nbaccel.notebook.magics import unregister
    from nbaccel.notebook.workers_comm import detach

    detach(ipython)
    unregister(ipython)


def _start_fork_server() -> None:
    """Fork nbaccel's fork server now, while the kernel is still fork-safe (nbaccel.launch.fork_server)."""
    from nbaccel.launch.fork_server import start_early

    start_early()


def _in_a_kernel() -> bool:
    app = sys.modules.get("ipykernel.kernelapp")
    return app is not None and bool(app.IPKernelApp.initialized())


if _in_a_kernel():  # `import nbaccel` in a notebook: later the kernel may touch CUDA
    _start_fork_server()
