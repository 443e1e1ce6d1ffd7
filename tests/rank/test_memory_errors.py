"""Out-of-memory errors raised in a rank are worded with the rank, the device and the peak.

Imports internals (rank): it tests those units directly, below the public face.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from nbaccel.rank import memory_errors


def test_a_memory_error_names_the_rank_and_its_peak_resident_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    words = memory_errors.note(MemoryError())
    assert words is not None and words.startswith("out of memory on rank 3: peak ") and " resident" in words


def test_a_cuda_out_of_memory_error_names_the_rank_the_device_and_its_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=80 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100")
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device: int(79.5 * 2**30))
    words = memory_errors.note(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert words == "out of memory on rank 1, cuda:2 (NVIDIA H100): peak 79.5 GiB reserved of 80.0 GiB"


def test_a_cuda_error_whose_context_is_broken_still_names_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")

    def broken() -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "current_device", broken)
    assert memory_errors.note(torch.cuda.OutOfMemoryError("x")) == "out of memory on rank 0, on its GPU"


def test_other_errors_get_no_words() -> None:
    assert memory_errors.note(ValueError("boom")) is None
