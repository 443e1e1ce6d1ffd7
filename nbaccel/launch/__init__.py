"""Kernel side of a launch: options and planning, preflight, rendezvous, starters, the rank group, the event loop and its policies, outcomes."""
