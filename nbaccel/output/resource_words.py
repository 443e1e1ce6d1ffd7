"""A rank's sampled resource use in a few words, for its chip, ``%distributed status`` and summaries.

Example:
    >>> resource_words({"cpu": 97.4, "rss": 3 * 2**29, "peak_rss": 2**31})
    'cpu 97% · 1.5 GiB'
    >>> resource_words({"cpu": 3.0, "rss": 2**28, "gpu_mem": 5 * 2**30, "gpu_util": 88})
    'cpu 3% · 256 MiB · gpu 5.0 GiB 88%'
    >>> resource_words({"cpu": 3.0, "rss": 2**28, "gpu_mem": None, "gpu_util": 40})  # NVML could not name its pid
    'cpu 3% · 256 MiB · gpu 40%'
    >>> peak_words({"peak_rss": 2**31}), peak_words({"peak_rss": 2**31, "peak_gpu_mem": 5 * 2**30})
    ('peak 2.0 GiB', 'peak 2.0 GiB · gpu peak 5.0 GiB')
    >>> peak_words({"peak_rss": 2**31, "cpu_time": 754.2, "peak_gpu_mem": 5 * 2**30})
    'peak 2.0 GiB · cpu 12 min 34 s · gpu peak 5.0 GiB'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbaccel.output.status_words import elapsed_words
from nbaccel.wire.sizes import gib


def resource_words(sample: Mapping[str, Any]) -> str:
    """``cpu 97% · 1.5 GiB`` (and ``· gpu 5.0 GiB 88%`` for a rank on a GPU, as far as NVML says)."""
    parts = [f"cpu {float(sample.get('cpu', 0.0)):.0f}%"]
    if sample.get("rss") is not None:
        parts.append(gib(int(sample["rss"])))
    gpu = gpu_words(sample)
    if gpu:
        parts.append(gpu)
    return " · ".join(parts)


def gpu_words(sample: Mapping[str, Any]) -> str:
    """``gpu 5.0 GiB 88%``: the rank's device memory and its GPU's utilisation; "" when neither is known.

    >>> gpu_words({"gpu_mem": 2**30}), gpu_words({"cpu": 1.0})
    ('gpu 1.0 GiB', '')
    """
    figures = []
    if sample.get("gpu_mem") is not None:
        figures.append(gib(int(sample["gpu_mem"])))
    if sample.get("gpu_util") is not None:
        figures.append(f"{float(sample['gpu_util']):.0f}%")
    return f"gpu {' '.join(figures)}" if figures else ""


def peak_words(sample: Mapping[str, Any]) -> str:
    """``peak 2.0 GiB``: the most resident memory a rank held (then ``· cpu 3.2 s``, the CPU time it
    used, where sampled, and ``· gpu peak 5.0 GiB`` on a GPU): a finished rank's figures."""
    words = f"peak {gib(int(sample.get('peak_rss') or 0))}"
    if sample.get("cpu_time") is not None:
        words += f" · cpu {elapsed_words(float(sample['cpu_time']))}"
    if sample.get("peak_gpu_mem") is not None:
        words += f" · gpu peak {gib(int(sample['peak_gpu_mem']))}"
    return words
