"""How far a node's clock is from the kernel's, measured NTP-style over the signed link.

The clock is the one torch.profiler's traces use: ``CLOCK_REALTIME``, Unix-epoch nanoseconds
(``time.time_ns()``; torch 2.13's ``c10::getTime`` and kineto's ``baseTimeNanoseconds``). A probe
is four readings: the kernel sends its time ``t0``, the agent notes ``t1`` when the probe arrives
and ``t2`` when it answers, the kernel notes ``t3`` when the answer arrives. Then::

    offset     = ((t1 - t0) + (t2 - t3)) / 2   # the node's clock minus the kernel's
    round trip = (t3 - t0) - (t2 - t1)         # the network both ways, and any wait to be read

The true offset lies within half the round trip of the estimate whatever the delays were, so of
a few samples the one with the smallest round trip is kept (``NodeClock.best``). A node's time
``t`` is the kernel's ``t - offset``.

``NBACCEL_TEST_CLOCK_SKEW_NS`` is a test seam, nothing else (``nbaccel.testing`` lists it): a
process that has it in its environment when this module is imported reads ``now_ns()`` that many
nanoseconds ahead, and ``skew_trace`` moves its profiler traces as far, so an agent on loopback
answers probes, and its ranks stamp their traces, as a machine whose clock is really off would.
It is read once, at start (``read_test_skew``); ``now_ns`` adds a number, nothing more.

Example:
    >>> probe = ClockSample(t0=1_000_000, t1=6_100_000, t2=6_200_000, t3=1_300_000)  # 5 ms ahead
    >>> probe.offset_ns, probe.round_trip_ns
    (5000000, 200000)
    >>> clock = NodeClock()
    >>> clock.add(ClockSample(0, 5_900_000, 5_950_000, 1_000_000))  # a slow answer: 0.95 ms there and back
    >>> clock.add(probe)
    >>> clock.offset_ns, clock.round_trip_ns, clock.describe()
    (5000000, 200000, '+5.000 ms ± 0.100 ms')
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TEST_SKEW_ENV = "NBACCEL_TEST_CLOCK_SKEW_NS"  # a test seam: shifts this process's now_ns()
JOIN_SAMPLES = 5  # probes in a row when an agent joins; then one with each heartbeat
KEPT_SAMPLES = 64  # the best of the latest 64 (32 s of heartbeats): fresh, yet one good one is enough


def skew_ns(environ: Mapping[str, str] | None = None) -> int:
    """The test-only skew of this process's clock (0 unless ``NBACCEL_TEST_CLOCK_SKEW_NS`` is set).

    Example:
        >>> skew_ns({TEST_SKEW_ENV: "5000000000"}), skew_ns({})
        (5000000000, 0)
    """
    value = (os.environ if environ is None else environ).get(TEST_SKEW_ENV, "")
    if not value:
        return 0
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{TEST_SKEW_ENV}={value!r} is not a whole number of nanoseconds; it is a test seam: unset it, or give e.g. 5000000000") from None


def read_test_skew(environ: Mapping[str, str] | None = None) -> int:
    """Read the test seam (this process's environment by default) and use it from now on; done
    once when this module is imported, so a process keeps the skew it started with.

    Example:
        >>> before = test_skew()
        >>> read_test_skew({TEST_SKEW_ENV: "7"}), test_skew()
        (7, 7)
        >>> read_test_skew({TEST_SKEW_ENV: str(before)}) == before
        True
    """
    global _skew
    _skew = skew_ns(environ)
    return _skew


def test_skew() -> int:
    """The skew this process's clock runs with (0 but under the test seam)."""
    return _skew


def now_ns() -> int:
    """This machine's realtime clock in Unix-epoch ns, as torch.profiler stamps traces (plus the test skew)."""
    return time.time_ns() + _skew


_BASE_TIME = re.compile(r'"baseTimeNanoseconds":\s*(\d+)')


def skew_trace(trace: str) -> str:
    """A Chrome trace torch.profiler wrote in this process, as this process's clock stamps it:
    unchanged (and not parsed) but under the test seam, which moves its base time by the skew.
    torch's profiler reads CLOCK_REALTIME in C++, which cannot be shifted from outside.

    Example:
        >>> read_test_skew({TEST_SKEW_ENV: "5"})
        5
        >>> skew_trace('{"baseTimeNanoseconds": 1000, "traceEvents": []}')
        '{"baseTimeNanoseconds": 1005, "traceEvents": []}'
        >>> _ = read_test_skew()  # back to what this process started with
    """
    if not _skew:
        return trace
    return _BASE_TIME.sub(lambda m: f'"baseTimeNanoseconds": {int(m.group(1)) + _skew}', trace, count=1)


@dataclass(frozen=True)
class ClockSample:
    """One probe's four readings: ``t0``/``t3`` on the kernel's clock, ``t1``/``t2`` on the node's."""

    t0: int
    t1: int
    t2: int
    t3: int

    @property
    def offset_ns(self) -> int:
        """The node's clock minus the kernel's."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) // 2

    @property
    def round_trip_ns(self) -> int:
        """The probe's time on the way there and back (the node's own handling left out)."""
        return (self.t3 - self.t0) - (self.t2 - self.t1)


class NodeClock:
    """The latest samples of one node's clock and the best of them (the smallest round trip).

    One thread adds (the cluster's); any may read: ``best`` is replaced whole, never changed.
    """

    def __init__(self) -> None:
        self._samples: deque[ClockSample] = deque(maxlen=KEPT_SAMPLES)
        self.best: ClockSample | None = None
        self.count = 0  # samples ever taken (the join's burst ends at JOIN_SAMPLES)

    def add(self, sample: ClockSample) -> None:
        if sample.round_trip_ns < 0:  # a clock stepped (NTP) between the readings: nothing to learn
            return
        self._samples.append(sample)
        self.count += 1
        self.best = min(self._samples, key=lambda s: s.round_trip_ns)

    @property
    def offset_ns(self) -> int | None:
        """The node's clock minus the kernel's, or None before the first answer."""
        best = self.best
        return None if best is None else best.offset_ns

    @property
    def round_trip_ns(self) -> int | None:
        best = self.best
        return None if best is None else best.round_trip_ns

    def describe(self) -> str:
        """``+5000.012 ms ± 0.150 ms`` (the offset, and half the round trip: how far it may be off)."""
        best = self.best
        return "not measured" if best is None else offset_words(best.offset_ns, best.round_trip_ns)

    def __repr__(self) -> str:
        return f"NodeClock({self.describe()}, {self.count} samples)"


def offset_words(offset_ns: int, round_trip_ns: int) -> str:
    """An offset and its uncertainty (half the round trip) in milliseconds.

    Example:
        >>> offset_words(-2_500_000, 300_000)
        '-2.500 ms ± 0.150 ms'
    """
    return f"{offset_ns / 1e6:+.3f} ms ± {round_trip_ns / 2e6:.3f} ms"


def answer(probe: Mapping[str, Any], received_ns: int) -> dict[str, int]:
    """The node's answer to a probe (``{"t0": ...}``) that arrived at ``received_ns``.

    Example:
        >>> sorted(answer({"t0": 7}, received_ns=10))
        ['t0', 't1', 't2']
    """
    return {"t0": int(probe["t0"]), "t1": received_ns, "t2": now_ns()}


def sample_of(reply: Mapping[str, Any], received_ns: int) -> ClockSample:
    """The sample an answer (``answer``'s dict) makes with the kernel's ``received_ns``."""
    return ClockSample(int(reply["t0"]), int(reply["t1"]), int(reply["t2"]), received_ns)


_skew = 0
read_test_skew()  # once, at start: a process keeps the clock it started with
