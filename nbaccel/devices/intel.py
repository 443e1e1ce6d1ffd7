"""Intel GPUs (XPU), read off the DRM render nodes in sysfs: never through Level Zero in the kernel.

``torch.xpu.device_count()`` initialises Level Zero (through SYCL) unless pyzes is installed
(pytorch #178496), and a rank forked after that cannot use its GPU; importing IPEX does the same
(vllm #7810). So the kernel counts the render nodes the GPU driver (i915 or xe) publishes:
``/sys/class/drm/renderD*/device`` with Intel's PCI vendor id ``0x8086`` and a display-controller
class (``0x03xxxx``), in PCI address order (Level Zero's order with
``ZE_ENABLE_PCI_ID_DEVICE_ORDER=1``, and the usual one). One card is one device: under Level
Zero's FLAT hierarchy a multi-tile card (Data Center GPU Max) shows each tile as a device, which
this count does not see (nbaccel then plans one rank per card). ``ZE_AFFINITY_MASK`` in the
kernel is honoured (``0,2``; ``1.0`` names a tile of card 1 and counts as one device).

Initialised Level Zero keeps a render node of each GPU it opened: an open Intel render node in
``/proc/self/fd`` says this process initialised it.

Example:
    >>> machine_gpus()  # no Intel GPU on this machine
    []
    >>> ze_initialised()
    False
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from nbaccel.devices import sysfs

INTEL_VENDOR = 0x8086
_DISPLAY_CLASS = 0x03  # PCI base class: display controller (VGA 0x0300, 3D 0x0302, other 0x0380)


@dataclass(frozen=True)
class IntelGpu:
    """One Intel GPU: its place in Level Zero's order, its render node and PCI address."""

    index: int
    render_node: str  # "renderD128"
    pci_address: str  # "0000:3a:00.0"
    device_id: int  # the PCI device id (0x0bd5: Data Center GPU Max 1550)


def machine_gpus() -> list[IntelGpu]:
    """Every Intel GPU of this machine in PCI order (empty without one)."""
    folder = sysfs.path("sys", "class", "drm")
    try:
        names = [n for n in os.listdir(folder) if n.startswith("renderD")]
    except OSError:
        return []
    found = []
    for name in names:
        device = folder / name / "device"
        if _hex(sysfs.read_text(device / "vendor")) != INTEL_VENDOR or (_hex(sysfs.read_text(device / "class")) or 0) >> 16 != _DISPLAY_CLASS:
            continue
        found.append((_pci_address(device), name, _hex(sysfs.read_text(device / "device")) or 0))
    return [IntelGpu(index, name, address, device_id) for index, (address, name, device_id) in enumerate(sorted(found))]


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def _pci_address(device: Path) -> str:
    try:
        return os.path.basename(os.readlink(device))  # ../../../0000:3a:00.0
    except OSError:
        return device.parent.name  # a stand-in tree without links: the render node's name orders them


def visible(gpus: Sequence[IntelGpu], environ: Mapping[str, str] | None = None) -> list[IntelGpu]:
    """The devices Level Zero shows this process under ``ZE_AFFINITY_MASK`` (unset: all).

    >>> gpus = [IntelGpu(i, f"renderD{128 + i}", f"0000:{i:02x}:00.0", 0x0BD5) for i in range(3)]
    >>> [g.index for g in visible(gpus, {"ZE_AFFINITY_MASK": "2,0.1"})], visible(gpus, {"ZE_AFFINITY_MASK": ""})
    ([2, 0], [])
    """
    mask = (os.environ if environ is None else environ).get("ZE_AFFINITY_MASK")
    if mask is None:
        return list(gpus)
    chosen: list[IntelGpu] = []
    for raw in mask.split(","):
        card = raw.strip().split(".", 1)[0]
        if not card.isdigit() or int(card) >= len(gpus):
            continue  # Level Zero ignores an entry that names no device
        chosen.append(gpus[int(card)])
    return chosen


def visible_gpus(environ: Mapping[str, str] | None = None) -> list[IntelGpu]:
    """The Intel GPUs this process may use, in Level Zero's order."""
    return visible(machine_gpus(), environ)


def ze_initialised() -> bool:
    """True when this process holds an Intel GPU's render node open (Level Zero ran here).

    Asked before every launch: the machine's Intel render nodes are read once per root (GPUs do
    not come and go under a running kernel), then only ``/proc/self/fd`` where there are any.
    """
    return bool(sysfs.open_device_files(set(_render_nodes(sysfs.root()))))


@functools.lru_cache(maxsize=4)
def _render_nodes(root: Path) -> tuple[Path, ...]:
    return tuple(node for gpu in machine_gpus() if (node := root / "dev" / "dri" / gpu.render_node).exists())
