"""Accelerate's RTX 40-series guard: which NCCL transports to turn off for these GPUs and driver.

GeForce RTX 40xx cards do not support NCCL's peer-to-peer and InfiniBand paths under drivers
older than 550.40.07 (Accelerate's ``check_cuda_p2p_ib_support``: a launch hangs or its numbers
are wrong); Accelerate then sets ``NCCL_P2P_DISABLE=1`` and ``NCCL_IB_DISABLE=1``. Decided here
from NVML's names and driver version, for several ranks only (one rank talks to no peer).

Example:
    >>> from nbaccel.devices.nvml import Gpu
    >>> rtx = Gpu(0, "GPU-1", "NVIDIA GeForce RTX 4090", (8, 9))
    >>> rtx40_nccl_variables([rtx, rtx], "535.104.05", ranks=2)
    {'NCCL_P2P_DISABLE': '1', 'NCCL_IB_DISABLE': '1'}
    >>> rtx40_nccl_variables([rtx, rtx], "550.54.15", ranks=2)
    {}
"""

from __future__ import annotations

from collections.abc import Sequence

from nbaccel.devices.nvml import Gpu

RTX40_GOOD_DRIVER = "550.40.07"


def version_tuple(version: str) -> tuple[int, ...]:
    """``"550.40.07"`` -> ``(550, 40, 7)``; parts that are not numbers count as 0."""
    return tuple(int(part) if part.isdigit() else 0 for part in version.strip().split("."))


def rtx40_nccl_variables(gpus: Sequence[Gpu], driver_version: str | None, ranks: int) -> dict[str, str]:
    """The NCCL variables to set for ``ranks`` ranks on ``gpus`` under ``driver_version``."""
    if ranks < 2 or not driver_version or not any("RTX 40" in gpu.name for gpu in gpus):
        return {}
    if version_tuple(driver_version) >= version_tuple(RTX40_GOOD_DRIVER):
        return {}
    return {"NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
