"""Exceptions nbaccel raises. Every message says what was detected, why it breaks, and how to fix it."""

from __future__ import annotations


class NbaccelError(Exception):
    """Base class of every error nbaccel raises on purpose."""


class PreflightError(NbaccelError):
    """A check before forking found something that would break the launch; nothing was started."""
