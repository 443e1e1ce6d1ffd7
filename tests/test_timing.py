"""One time scale for every bound a test sets (nbaccel.testing.scaled)."""

from __future__ import annotations

import os

import pytest

from nbaccel.testing import TIME_SCALE_VARIABLE, scaled, time_scale


def test_the_variable_sets_the_scale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TIME_SCALE_VARIABLE, "3")
    assert time_scale() == 3.0 and scaled(2.5) == 7.5


@pytest.mark.parametrize("value", ["0", "-1", "fast", "inf"])
def test_a_scale_that_is_not_a_positive_number_says_so(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(TIME_SCALE_VARIABLE, value)
    with pytest.raises(ValueError, match=rf"NBACCEL_TEST_TIME_SCALE='{value}' is not a positive number: set it to e.g. 2"):
        time_scale()


def test_without_the_variable_ci_doubles_it_and_load_raises_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TIME_SCALE_VARIABLE, raising=False)
    cpus = os.cpu_count() or 1
    monkeypatch.setattr(os, "getloadavg", lambda: (0.1, 0.1, 0.1))
    monkeypatch.delenv("CI", raising=False)
    assert time_scale() == 1.0
    monkeypatch.setenv("CI", "true")
    assert time_scale() == 2.0
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0 * cpus, 0.0, 0.0))  # three runnable processes per CPU
    assert time_scale() == 6.0
    monkeypatch.setattr(os, "getloadavg", lambda: (100.0 * cpus, 0.0, 0.0))
    assert time_scale() == 8.0  # the load's share is capped at 4


class _Item:
    """What _scale_timeouts uses of a pytest item: its markers."""

    def __init__(self, *marks: pytest.MarkDecorator) -> None:
        self.marks = [m.mark for m in marks]

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return next((m for m in self.marks if m.name == name), None)

    def add_marker(self, mark: pytest.MarkDecorator, append: bool = True) -> None:
        self.marks.insert(len(self.marks) if append else 0, mark.mark)


class _Config:
    def getoption(self, name: str, default: object = None) -> object:
        return None

    def getini(self, name: str) -> str:
        return "120"


def test_every_time_limit_of_the_suite_is_scaled(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import _scale_timeouts

    monkeypatch.setenv(TIME_SCALE_VARIABLE, "2")
    marked, unmarked, by_keyword = _Item(pytest.mark.timeout(30)), _Item(), _Item(pytest.mark.timeout(timeout=5, method="thread"))
    _scale_timeouts(_Config(), [marked, unmarked, by_keyword])  # type: ignore[arg-type]
    assert marked.get_closest_marker("timeout").args == (60.0,)  # type: ignore[union-attr]
    assert unmarked.get_closest_marker("timeout").args == (240.0,)  # type: ignore[union-attr]  # the configured 120 s
    assert by_keyword.get_closest_marker("timeout").args == (10.0,) and by_keyword.get_closest_marker("timeout").kwargs == {"method": "thread"}  # type: ignore[union-attr]
