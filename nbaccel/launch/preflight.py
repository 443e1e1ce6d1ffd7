"""Checks made in the kernel before anything forks: what would break a forked rank, and devices.

Example:
    >>> fork_hazards()  # a fresh kernel
    []
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from nbaccel.errors import PreflightError


def fork_hazards() -> list[str]:
    """Reasons why a rank forked from this process now would break; empty when forking is safe.

    Only modules already imported are inspected: checking must not import torch or touch CUDA.
    """
    hazards = []
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = getattr(torch, "cuda", None)
        if cuda is not None and cuda.is_initialized():
            hazards.append(
                "CUDA is already initialised in this kernel (a tensor was put on a GPU, or a library "
                "did so on import), and CUDA cannot be used in a process forked after that"
            )
        elif cuda is not None and getattr(cuda, "_is_in_bad_fork", lambda: False)():
            hazards.append("this kernel is itself a process forked after CUDA was initialised")
        dist = getattr(torch, "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            hazards.append(
                "a torch.distributed process group is already initialised in this kernel, and a "
                "forked rank would inherit a copy it cannot use"
            )
    return hazards


def fork_error(hazards: Sequence[str]) -> PreflightError:
    reasons = "; ".join(hazards)
    return PreflightError(
        f"cannot fork the ranks: {reasons}. Restart the kernel and keep GPU work inside the launched "
        "function (or the %%distributed cell), or pass start_method='spawn' (slower: every rank "
        "starts a fresh interpreter and the function travels by cloudpickle)."
    )


def visible_gpu_count() -> int:
    """CUDA devices this process may use, counted without initialising CUDA (NVML)."""
    torch = _import_torch()
    return int(torch.cuda.device_count())


def check_gpus(gpus: Sequence[int], visible: int) -> tuple[int, ...]:
    chosen = tuple(int(g) for g in gpus)
    if not chosen:
        raise ValueError("gpus is empty: name at least one CUDA device index, e.g. gpus=[0, 1].")
    bad = [g for g in chosen if not 0 <= g < visible]
    if bad:
        raise ValueError(
            f"gpus={list(chosen)!r} names device(s) {bad!r}, but only {visible} GPU(s) are visible "
            f"(indices 0..{visible - 1}); check CUDA_VISIBLE_DEVICES or pick from that range."
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"gpus={list(chosen)!r} names a device twice: each rank needs its own GPU.")
    return chosen


def _import_torch() -> Any:
    import torch

    return torch
