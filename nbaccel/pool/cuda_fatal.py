"""Unrecoverable CUDA errors: after one, the rank's CUDA context is gone for good.

A device-side assert, an illegal memory access or a launch failure poisons the CUDA context of
the process it happened in: every later CUDA call there fails with the same error, so a worker
that met one fails every later cell. torch reports these as ``torch.AcceleratorError`` (a
``RuntimeError`` before torch 2.8) whose message starts with CUDA's own words; they are told
apart from recoverable errors (out of memory, a shape mismatch) by those words.

Example:
    >>> unrecoverable_cuda_error("CUDA error: device-side assert triggered")
    'CUDA error: device-side assert triggered'
    >>> unrecoverable_cuda_error("CUDA out of memory. Tried to allocate 2.00 GiB") is None
    True
"""

from __future__ import annotations

import re

from nbaccel.launch.outcome import RankOutcome

# CUDA's messages for sticky errors (cudaGetErrorString), and their enum names, which newer torch
# prints too ("Search for `cudaErrorAssert' ...").
_STICKY = re.compile(
    r"CUDA error: (device-side assert triggered|an illegal memory access was encountered|"
    r"unspecified launch failure|an illegal instruction was encountered|misaligned address|"
    r"uncorrectable ECC error encountered|the launch timed out and was terminated|"
    r"invalid program counter|hardware stack error|operation not supported on global/shared address space)"
    r"|cudaError(Assert|IllegalAddress|LaunchFailure|IllegalInstruction|MisalignedAddress|ECCUncorrectable|LaunchTimeout)\b",
)


def unrecoverable_cuda_error(message: str) -> str | None:
    """The first line of ``message`` when it reports a sticky CUDA error, else None."""
    if _STICKY.search(message) is None:
        return None
    return message.strip().splitlines()[0]


def ranks_with_dead_cuda(outcomes: list[RankOutcome]) -> list[tuple[int, str]]:
    """(rank, the error's first line) for every rank whose task failed with a sticky CUDA error."""
    found = []
    for outcome in outcomes:
        error = outcome.error
        if error is not None:
            line = unrecoverable_cuda_error(error.message)
            if line is not None:
                found.append((outcome.rank, line))
    return found


def dead_cuda_notice(found: list[tuple[int, str]]) -> str:
    """One line: which rank, which error, and what to do.

    Example:
        >>> dead_cuda_notice([(1, "CUDA error: an illegal memory access was encountered")])
        'rank 1 hit an unrecoverable CUDA error (CUDA error: an illegal memory access was encountered): its CUDA context is unusable, so every later cell would fail there; the workers were stopped. Run %distributed restart for fresh ones with the same options.'
    """
    ranks = ", ".join(str(rank) for rank, _ in found)
    noun, its = ("rank", "its") if len(found) == 1 else ("ranks", "their")
    return (
        f"{noun} {ranks} hit an unrecoverable CUDA error ({found[0][1]}): {its} CUDA context is unusable, "
        "so every later cell would fail there; the workers were stopped. Run %distributed restart "
        "for fresh ones with the same options."
    )
