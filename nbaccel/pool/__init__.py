"""Persistent workers: a process group (and GPU memory, and namespaces) that lives across cells.

``nbaccel.start_workers`` (``nbaccel/launcher.py``) starts them here, or across nodes for ``cluster=``.

Example:
    >>> import nbaccel
    >>> pool = nbaccel.start_workers(2)
    >>> pool.run(lambda: __import__("os").environ["RANK"])
    ['0', '1']
    >>> pool.stop()
"""

from nbaccel.pool.pool import PoolStoppedError, WorkerPool, WorkerStatus, start_local_workers

__all__ = ["PoolStoppedError", "WorkerPool", "WorkerStatus", "start_local_workers"]
