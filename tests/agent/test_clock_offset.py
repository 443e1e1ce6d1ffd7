"""A node's clock offset, unit level: the NTP arithmetic, the best of a few samples, the test seam,
and a probe answered over a real signed link.

Imports internals (net.clock, net.link) and the seam's switch in nbaccel.testing: it tests those units directly, below the public face.
"""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from nbaccel.net import clock, protocol
from nbaccel.net.clock import ClockSample, NodeClock
from nbaccel.net.link import Link
from nbaccel.net.signing import new_secret
from nbaccel.testing import scaled, skewed_clock_environment

pytestmark = pytest.mark.timeout(20)


def _probe(offset_ns: int, there_ns: int, handling_ns: int, back_ns: int, t0: int = 10**18) -> ClockSample:
    """The readings of one probe to a node ``offset_ns`` ahead, with these delays."""
    t1 = t0 + there_ns + offset_ns
    t2 = t1 + handling_ns
    return ClockSample(t0, t1, t2, t2 - offset_ns + back_ns)


def test_symmetric_delays_give_the_exact_offset_and_the_round_trip_leaves_out_the_nodes_handling() -> None:
    sample = _probe(offset_ns=5 * 10**9, there_ns=100_000, handling_ns=7_000_000, back_ns=100_000)
    assert sample.offset_ns == 5 * 10**9
    assert sample.round_trip_ns == 200_000


@pytest.mark.parametrize("offset_ns", [0, 5 * 10**9, -3 * 10**9, 123_456_789])
def test_whatever_the_delays_the_true_offset_is_within_half_the_round_trip(offset_ns: int) -> None:
    rng = random.Random(offset_ns)
    for _ in range(200):
        sample = _probe(offset_ns, rng.randrange(10**7), rng.randrange(10**7), rng.randrange(10**7))
        assert abs(sample.offset_ns - offset_ns) <= sample.round_trip_ns / 2 + 1


def test_the_sample_with_the_smallest_round_trip_is_kept_of_the_latest_ones() -> None:
    node = NodeClock()
    assert node.best is None and node.offset_ns is None and node.describe() == "not measured"
    node.add(_probe(5 * 10**9, there_ns=9_000_000, handling_ns=0, back_ns=1_000_000))  # off by 4 ms, 10 ms round trip
    node.add(_probe(5 * 10**9, there_ns=100_000, handling_ns=50_000, back_ns=140_000))
    node.add(_probe(5 * 10**9, there_ns=3_000_000, handling_ns=0, back_ns=0))
    assert node.count == 3 and node.round_trip_ns == 240_000
    assert node.offset_ns is not None and abs(node.offset_ns - 5 * 10**9) <= 20_000
    assert node.describe() == "+4999.980 ms ± 0.120 ms"
    for _ in range(clock.KEPT_SAMPLES):  # the good sample ages out: a clock that drifts is followed
        node.add(_probe(5 * 10**9 + 1_000_000, there_ns=500_000, handling_ns=0, back_ns=500_000))
    assert node.round_trip_ns == 1_000_000 and node.offset_ns == 5 * 10**9 + 1_000_000


def test_a_clock_stepped_between_the_readings_teaches_nothing() -> None:
    node = NodeClock()
    node.add(ClockSample(t0=1_000, t1=2_000, t2=9_000, t3=1_500))  # the node's clock jumped while it answered
    assert node.count == 0 and node.best is None


@pytest.fixture
def own_skew() -> Iterator[None]:
    """Whatever a test sets through the seam, this process gets back the skew it started with."""
    try:
        yield
    finally:
        clock.read_test_skew()


def test_the_seam_shifts_now_and_a_bad_value_is_refused_clearly(own_skew: None) -> None:
    clock.read_test_skew({})
    plain = clock.now_ns()
    clock.read_test_skew({clock.TEST_SKEW_ENV: str(5 * 10**9)})
    assert 5 * 10**9 <= clock.now_ns() - plain < 5 * 10**9 + 10**9
    with pytest.raises(ValueError, match=r"NBACCEL_TEST_CLOCK_SKEW_NS='5s' is not a whole number of nanoseconds; it is a test seam"):
        clock.read_test_skew({clock.TEST_SKEW_ENV: "5s"})


def test_the_seam_is_read_once_when_a_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Set later, the variable changes nothing in this process; a process started with it runs skewed."""
    monkeypatch.setenv(clock.TEST_SKEW_ENV, str(5 * 10**9))
    plain = clock.now_ns()
    assert clock.now_ns() - plain < 10**9 and clock.test_skew() == 0
    script = "from nbaccel.net import clock; print(clock.now_ns())"
    started = subprocess.run([sys.executable, "-c", script], env=skewed_clock_environment(5 * 10**9), capture_output=True, text=True, timeout=60, check=True)
    assert 5 * 10**9 <= int(started.stdout) - plain < 5 * 10**9 + scaled(30) * 10**9
    refused = subprocess.run(
        [sys.executable, "-c", script], env=skewed_clock_environment(0) | {clock.TEST_SKEW_ENV: "5s"}, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "NBACCEL_TEST_CLOCK_SKEW_NS='5s' is not a whole number of nanoseconds" in refused.stderr


def test_a_probe_answered_over_a_signed_link_measures_a_skewed_peer(own_skew: None) -> None:
    """Both ends in this process: the "node" end reads its clock 2 s ahead through the seam."""
    secret = new_secret()
    left, right = socket.socketpair()
    kernel, node = Link(left, secret, "kernel", "k.a"), Link(right, secret, "node", "k.a")
    try:
        kernel.start_session("k.a")
        node.start_session("k.a")
        kernel.send(protocol.CLOCK, {"t0": clock.now_ns()})
        clock.read_test_skew({clock.TEST_SKEW_ENV: str(2 * 10**9)})
        (probe,) = node.receive()
        node.send(protocol.CLOCK, clock.answer(probe.json(), clock.now_ns()))
        clock.read_test_skew({})
        (reply,) = kernel.receive()
        sample = clock.sample_of(reply.json(), clock.now_ns())
    finally:
        kernel.close()
        node.close()
    assert reply.kind == protocol.CLOCK
    assert abs(sample.offset_ns - 2 * 10**9) <= sample.round_trip_ns / 2 + 1
    assert 0 <= sample.round_trip_ns < 10**9
