"""Has this process initialised the CUDA driver? Asked of ``libcuda.so.1`` without initialising it.

A rank forked after ``cuInit`` dies at its first CUDA call ("CUDA error: initialization error").
torch's own flag (``torch.cuda.is_initialized()``) misses the commonest way in: without
``PYTORCH_NVML_BASED_CUDA_CHECK=1``, ``torch.cuda.is_available()`` runs ``cuInit`` and leaves the
flag False; some libraries do the same on import. So ask the driver. Until ``cuInit`` ran,
``cuDeviceGetCount`` answers CUDA_ERROR_NOT_INITIALIZED (3) and touches nothing; afterwards it
answers CUDA_SUCCESS. A process that never loaded ``libcuda`` cannot have initialised it, so the
probe first asks the dynamic loader (``RTLD_NOLOAD``) and loads nothing. This module never calls
``cuInit``.

``NBACCEL_CUDA_DRIVER_LIBRARY`` names another library to ask (a test seam: the tests build a fake
``libcuda.so.1`` that records ``cuInit``).

Example:
    >>> driver_state()  # a process that never loaded libcuda
    <DriverState.NOT_LOADED: 'not loaded'>
    >>> cuda_initialised()
    False
"""

from __future__ import annotations

import _ctypes
import ctypes
import enum
import os

LIBRARY = "libcuda.so.1"
LIBRARY_VARIABLE = "NBACCEL_CUDA_DRIVER_LIBRARY"
CUDA_SUCCESS = 0
CUDA_ERROR_NOT_INITIALIZED = 3


class DriverState(str, enum.Enum):
    """What the CUDA driver says about this process."""

    ABSENT = "absent"  # no libcuda.so.1 can be loaded: no NVIDIA driver here
    NOT_LOADED = "not loaded"  # this process never loaded libcuda, so CUDA is untouched
    UNINITIALISED = "uninitialised"  # loaded, but cuInit never ran: forking is safe
    INITIALISED = "initialised"  # cuInit ran: a forked child cannot use CUDA


def library_path() -> str:
    """The driver library to ask: ``libcuda.so.1``, or the test seam's ``NBACCEL_CUDA_DRIVER_LIBRARY``."""
    return os.environ.get(LIBRARY_VARIABLE) or LIBRARY


def driver_state(load: bool = False) -> DriverState:
    """The driver's state in this process; ``load=True`` also tells ABSENT from NOT_LOADED.

    Loading ``libcuda`` (``load=True``) runs no ``cuInit``; the default loads nothing at all.
    """
    library = _loaded_library() if not load else _load_library()
    if library is None:
        return DriverState.ABSENT if load else DriverState.NOT_LOADED
    count = ctypes.c_int(0)
    code = library.cuDeviceGetCount(ctypes.byref(count))
    # Any answer but "not initialised" means cuInit ran (CUDA_ERROR_DEINITIALIZED, a broken
    # driver...): treat it as initialised, since forking is then unsafe or pointless.
    return DriverState.UNINITIALISED if code == CUDA_ERROR_NOT_INITIALIZED else DriverState.INITIALISED


def cuda_initialised() -> bool:
    """True when ``cuInit`` ran in this process (so a forked rank could not use CUDA)."""
    return driver_state() is DriverState.INITIALISED


def driver_present() -> bool:
    """True when this machine has a CUDA driver library (loads it; never initialises it)."""
    return driver_state(load=True) is not DriverState.ABSENT


_opened: dict[str, ctypes.CDLL] = {}  # a loaded driver stays loaded: keep its handle (a probe is then ~1 us)


def _loaded_library() -> ctypes.CDLL | None:
    """The driver library if this process loaded it already; never loads it."""
    path = library_path()
    if path in _opened:
        return _opened[path]
    try:
        handle = _ctypes.dlopen(path, os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        return None
    _opened[path] = ctypes.CDLL(path, handle=handle)
    return _opened[path]


_absent: set[str] = set()  # could not be loaded: a driver installed later needs a new kernel anyway


def _load_library() -> ctypes.CDLL | None:
    path = library_path()
    if path in _absent:  # a failed dlopen costs ~80 us a launch (the path searched, a class made)
        return None
    try:
        return ctypes.CDLL(path, mode=os.RTLD_LAZY)
    except OSError:
        _absent.add(path)
        return None
