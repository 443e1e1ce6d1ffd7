"""A rank's sampled resource use in a few words, for its chip, ``%distributed status`` and summaries.

Example:
    >>> resource_words({"cpu": 97.4, "rss": 3 * 2**29, "peak_rss": 2**31})
    'cpu 97% · 1.5 GiB'
    >>> resource_words({"cpu": 3.0, "rss": 2**28, "device_memory": 5 * 2**30, "gpu_util": 88})
    'cpu 3% · 256 MiB · gpu 5.0 GiB 88%'
    >>> peak_words({"peak_rss": 2**31})
    'peak 2.0 GiB'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nbaccel.wire.sizes import gib


def resource_words(sample: Mapping[str, Any]) -> str:
    """``cpu 97% · 1.5 GiB`` (and ``· gpu 5.0 GiB 88%`` where the device memory is known)."""
    parts = [f"cpu {float(sample.get('cpu', 0.0)):.0f}%"]
    if sample.get("rss") is not None:
        parts.append(gib(int(sample["rss"])))
    if sample.get("device_memory") is not None:
        util = f" {sample['gpu_util']:.0f}%" if sample.get("gpu_util") is not None else ""
        parts.append(f"gpu {gib(int(sample['device_memory']))}{util}")
    return " · ".join(parts)


def peak_words(sample: Mapping[str, Any]) -> str:
    """``peak 2.0 GiB``: the most resident memory a rank held."""
    return f"peak {gib(int(sample.get('peak_rss') or 0))}"
