"""Per-rank output: capture in the rank, relay in the kernel, sinks that show it."""
