"""Fixtures for the output tests: widgets without a kernel, with every comm message recorded."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

_ids = itertools.count()


@dataclass
class RecordingComm:
    """Stands in for a kernel comm: keeps what a widget opened with and every message it sent."""

    target_name: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    comm_id: str = ""
    sent: list[dict[str, Any]] = field(default_factory=list)
    closed: bool = False
    kernel: str = "present"  # ipywidgets only sends when the comm has a kernel

    def __post_init__(self) -> None:
        self.comm_id = self.comm_id or f"comm-{next(_ids)}"

    @property
    def model_name(self) -> str:
        return self.data.get("state", {}).get("_model_name", "")

    def send(self, data: dict[str, Any] | None = None, metadata: Any = None, buffers: Any = None) -> None:
        self.sent.append(data or {})

    def on_msg(self, callback: Any) -> None:
        pass

    def open(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self, *args: Any, **kwargs: Any) -> None:
        self.closed = True

    def updates(self, key: str) -> list[Any]:
        """Every value this comm's widget sent for trait ``key``, in order."""
        return [m["state"][key] for m in self.sent if m.get("method") == "update" and key in m.get("state", {})]


class CommLog(list[RecordingComm]):
    def of(self, model_name: str) -> list[RecordingComm]:
        return [c for c in self if c.model_name == model_name]

    def messages(self) -> int:
        return sum(len(c.sent) for c in self)


@pytest.fixture
def comms(monkeypatch: pytest.MonkeyPatch) -> Iterator[CommLog]:
    """Every comm ipywidgets creates during the test, recorded (no kernel needed)."""
    import ipywidgets.comm

    log = CommLog()

    def create_comm(**kwargs: Any) -> RecordingComm:
        comm = RecordingComm(target_name=kwargs.get("target_name", ""), data=kwargs.get("data") or {}, comm_id=kwargs.get("comm_id") or "")
        log.append(comm)
        return comm

    from ipywidgets.widgets.widget import _instances

    before = set(_instances)
    monkeypatch.setattr(ipywidgets.comm, "create_comm", create_comm)
    yield log
    for key in set(_instances) - before:  # widgets a test left open would be reaped noisily at exit
        _instances[key].close()


@dataclass
class FakePublisher:
    """Records what a WidgetSink displays: ("show" | "update", bundle, display_id)."""

    calls: list[tuple[str, dict[str, Any], str]] = field(default_factory=list)

    def show(self, bundle: dict[str, Any], display_id: str) -> None:
        self.calls.append(("show", bundle, display_id))

    def update(self, bundle: dict[str, Any], display_id: str) -> None:
        self.calls.append(("update", bundle, display_id))

    @property
    def final(self) -> dict[str, Any]:
        kind, bundle, _ = self.calls[-1]
        assert kind == "update", self.calls
        return bundle


@pytest.fixture
def publisher() -> FakePublisher:
    return FakePublisher()


class FakeClock:
    """A monotonic clock that moves only when the test says: ``clock.advance(0.05)``."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
