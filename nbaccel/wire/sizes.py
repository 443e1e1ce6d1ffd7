"""Sizes in the words a person reads, the same on both sides of the wire (a rank's error, the kernel's summary).

Example:
    >>> gib(3 * 2**29), gib(312 * 2**20)
    ('1.5 GiB', '312 MiB')
"""

from __future__ import annotations


def gib(size: int) -> str:
    """Bytes as ``1.5 GiB`` (from 1 GiB up) or ``312 MiB``."""
    if size >= 2**30:
        return f"{size / 2**30:.1f} GiB"
    return f"{size / 2**20:.0f} MiB"
