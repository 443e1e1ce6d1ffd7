"""Intel GPUs read off stand-in DRM render nodes: Intel's display controllers only, ZE_AFFINITY_MASK, initialised Level Zero.

Imports internals (devices.intel): it tests that unit directly, below the public face.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbaccel.devices import intel
from nbaccel.testing import device_root
from tests.devices.fakes import fake_drm_tree

pytestmark = pytest.mark.timeout(60)

CARDS = [
    ("0000:9a:00.0", 0x8086, 0x038000, "renderD130"),  # a Data Center GPU Max (display controller, "other")
    ("0000:3a:00.0", 0x8086, 0x038000, "renderD128"),
    ("0000:05:00.0", 0x1002, 0x030000, "renderD129"),  # an AMD card: not an XPU
    ("0000:00:02.0", 0x8086, 0x048000, "renderD131"),  # an Intel device of another class (not a GPU)
]


@pytest.fixture
def intel_box(tmp_path: Path) -> Iterator[Path]:
    root = fake_drm_tree(tmp_path / "root", CARDS)
    with device_root(root):
        yield root


def test_intel_display_controllers_in_pci_order(intel_box: Path) -> None:
    assert [(g.index, g.pci_address, g.render_node) for g in intel.machine_gpus()] == [(0, "0000:3a:00.0", "renderD128"), (1, "0000:9a:00.0", "renderD130")]


@pytest.mark.parametrize(("mask", "expected"), [(None, [0, 1]), ("1", [1]), ("1,0", [1, 0]), ("0.0,0.1", [0, 0]), ("", []), ("5,1", [1])])
def test_ze_affinity_mask_of_the_kernel_is_honoured(intel_box: Path, mask: str | None, expected: list[int]) -> None:
    assert [g.index for g in intel.visible_gpus({} if mask is None else {"ZE_AFFINITY_MASK": mask})] == expected


def test_an_open_render_node_says_level_zero_was_initialised_here(intel_box: Path) -> None:
    assert not intel.ze_initialised()
    amd_node = os.open(intel_box / "dev/dri/renderD129", os.O_RDWR)  # another vendor's GPU: not Level Zero's
    try:
        assert not intel.ze_initialised()
        fd = os.open(intel_box / "dev/dri/renderD130", os.O_RDWR)
        try:
            assert intel.ze_initialised()
        finally:
            os.close(fd)
    finally:
        os.close(amd_node)


def test_a_machine_without_drm_has_none(tmp_path: Path) -> None:
    with device_root(tmp_path):
        assert intel.machine_gpus() == [] and not intel.ze_initialised()
