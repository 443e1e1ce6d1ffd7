"""Rank side of rich output: hooks installed in a rank so display(), figures and progress bars
reach the kernel as channel events (ipykernel drops what a forked child sends itself).

Example (what the worker does right after redirecting stdio)::

    rank_hooks.install(channel_fd)
"""

from __future__ import annotations


def install(channel_fd: int) -> None:
    """Install the rank's rich-output hooks, sending events on ``channel_fd``.

    Plain text needs no hook (it flows through the stdout/stderr pipes); rich output arrives
    with the %%distributed widget work.
    """
