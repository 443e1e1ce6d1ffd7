"""Where this machine's device files are: ``/`` (``/sys``, ``/dev``), or a test's stand-in tree.

AMD and Intel GPUs are counted and watched through files the kernel driver publishes (the KFD
topology under ``/sys/class/kfd``, DRM render nodes under ``/sys/class/drm``, the device nodes
``/dev/kfd`` and ``/dev/dri/renderD*``), never through a runtime that would initialise the GPU
in the kernel. ``NBACCEL_DEVICE_ROOT`` names another folder standing for ``/`` (a test seam,
read once when this module is imported; ``nbaccel.testing.device_root`` changes it in a
running process).

Example:
    >>> str(path("sys", "class", "kfd"))
    '/sys/class/kfd'
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT_VARIABLE = "NBACCEL_DEVICE_ROOT"
_root = Path(os.environ.get(ROOT_VARIABLE) or "/")


def root() -> Path:
    """The folder that stands for ``/`` when device files are read."""
    return _root


def set_root(folder: str | os.PathLike[str] | None) -> None:
    """Read device files under ``folder`` from now on (None: ``/`` again). For tests."""
    global _root
    _root = Path(folder) if folder else Path("/")


def path(*parts: str) -> Path:
    """``/<parts>`` under the root."""
    return _root.joinpath(*parts)


def read_text(file: Path) -> str | None:
    """The file's text, stripped; None where it cannot be read (gone, not permitted)."""
    try:
        return file.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def open_device_files(devices: set[Path]) -> set[Path]:
    """Which of ``devices`` this process holds open (its ``/proc/self/fd`` links).

    A runtime that initialised a GPU keeps its device node open (ROCr ``/dev/kfd``, Level Zero a
    render node), so an open one says that runtime ran here; nothing is opened to find out.
    """
    if not devices:
        return set()
    wanted = {str(d) for d in devices}
    found = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return set()
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # closed meanwhile (the listing's own fd, say)
            continue
        if target in wanted:
            found.add(Path(target))
    return found
