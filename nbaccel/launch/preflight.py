"""Checks made in the kernel before anything forks: what would break a forked rank, and devices.

Example:
    >>> fork_hazards()  # a fresh kernel
    []
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from nbaccel.devices import amd, driver, intel
from nbaccel.errors import PreflightError
from nbaccel.launch.openmp import openmp_pool_started

# Reasons set by nbaccel.testing.mark_not_fork_safe: a kernel made unsafe without a GPU.
marked_unsafe: list[str] = []


class Hazard(str):
    """Why a fork now would break a rank: the reason itself (a ``str``), with its ``kind``.

    ``kind`` is ``"cuda"``, ``"rocm"``, ``"xpu"`` or ``"process_group"`` (never fork: the child
    cannot use what it inherited) or ``"openmp"`` (fork only with one CPU thread per rank, or from a fork server).

    >>> Hazard("openmp", "the OpenMP pool started").kind
    'openmp'
    """

    kind: str

    def __new__(cls, kind: str, reason: str) -> Hazard:
        hazard = super().__new__(cls, reason)
        hazard.kind = kind
        return hazard


NEVER_FORK = ("cuda", "rocm", "xpu", "process_group")
OPENMP = "openmp"


def fork_hazards() -> list[Hazard]:
    """Reasons why a rank forked from this process now would break; empty when forking is safe.

    Each reason is a ``Hazard`` (a ``str`` with a ``kind``). Nothing is imported or initialised
    to find out: torch is inspected only if imported, the CUDA driver is asked without ``cuInit``
    (``nbaccel.devices.driver``), and libgomp's threads are read off ``/proc`` (``launch.openmp``).
    """
    hazards = [Hazard("cuda", reason) for reason in marked_unsafe] + _cuda_hazards()  # marked: as if CUDA were initialised
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        hazards.append(
            Hazard(
                "process_group", "a torch.distributed process group is already initialised in this kernel, and a forked rank would inherit a copy it cannot use"
            )
        )
    if openmp_pool_started():
        hazards.append(
            Hazard(
                OPENMP,
                "this kernel ran a multi-threaded CPU op, and its OpenMP thread pool (libgomp) does not survive a fork: a forked rank would hang in its first multi-threaded op",
            )
        )
    return hazards


def _cuda_hazards() -> list[Hazard]:
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None) if torch is not None else None
    if (cuda is not None and cuda.is_initialized()) or driver.cuda_initialised():
        return [
            Hazard(
                "cuda",
                "CUDA is already initialised in this kernel (a tensor was put on a GPU, torch.cuda.is_available() asked the driver, or a library did so on import), and CUDA cannot be used in a process forked after that",
            )
        ]
    if cuda is not None and getattr(cuda, "_is_in_bad_fork", lambda: False)():
        return [Hazard("cuda", "this kernel is itself a process forked after CUDA was initialised")]
    return _other_runtimes(torch)


def _other_runtimes(torch: object) -> list[Hazard]:
    """AMD's and Intel's runtimes, initialised in this kernel (each keeps its device file open)."""
    if amd.hip_initialised():  # a ROCm torch's torch.cuda.is_initialized() misses is_available()'s hipGetDeviceCount
        return [
            Hazard(
                "rocm",
                "HIP (ROCm) is already initialised in this kernel (it holds /dev/kfd open: a tensor was put on a GPU, torch.cuda.is_available() asked HIP, or a library did so on import), and a process forked after that cannot use the GPU",
            )
        ]
    xpu = getattr(torch, "xpu", None) if torch is not None else None
    if (xpu is not None and getattr(xpu, "is_initialized", lambda: False)()) or intel.ze_initialised():
        return [
            Hazard(
                "xpu",
                "Level Zero (Intel XPU) is already initialised in this kernel (it holds a GPU's render node open: torch.xpu.device_count() without pyzes, a tensor on an XPU, or importing intel_extension_for_pytorch), and a process forked after that cannot use the GPU",
            )
        ]
    return []


def never_fork(hazards: Sequence[str]) -> list[str]:
    """The hazards no fork survives (a plain ``str`` counts as one: its kind is unknown)."""
    return [h for h in hazards if getattr(h, "kind", "cuda") in NEVER_FORK]


def fork_error(hazards: Sequence[str]) -> PreflightError:
    reasons = "; ".join(hazards)
    return PreflightError(
        f"cannot fork the ranks: {reasons}. Restart the kernel and keep GPU work inside the launched "
        "function (or the %%distributed cell), or pass start_method='spawn' (slower: every rank "
        "starts a fresh interpreter and the function travels by cloudpickle)."
    )


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
