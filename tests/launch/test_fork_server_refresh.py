"""The fork server's refresh: a launch never reads the server's memory, a cell at most every 30 s.

Reading a server's ``/proc/<pid>/smaps_rollup`` costs milliseconds when it maps torch; it used to
be read before every launch and after every cell. Imports internals (launch.starters.fork_server):
a stand-in server, so no process is started.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from nbaccel.launch.starters import fork_server


@dataclass
class IdleServer:
    pid: int = 12345
    how: str = "forked"
    running: bool = False
    modules: set[str] = field(default_factory=lambda: set(fork_server._warm_names()))
    closed: bool = False

    def alive(self) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def looks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every pid whose own memory is read; the server is a stand-in, its memory small."""
    read: list[int] = []
    monkeypatch.setattr(fork_server, "_server", IdleServer())
    monkeypatch.setattr(fork_server, "own_memory", lambda pid: read.append(pid) or 0)
    monkeypatch.setattr(fork_server, "_memory_looked_at", [float("-inf")])
    return read


def test_a_launch_never_reads_the_servers_memory(looks: list[int]) -> None:
    for _ in range(5):
        fork_server.refresh(memory=False)
    assert looks == []


def test_cells_read_it_at_most_every_30_seconds(looks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(fork_server.time, "monotonic", lambda: now[0])
    for _ in range(5):
        fork_server.refresh()
    assert looks == [12345]
    now[0] += fork_server._MEMORY_EVERY
    fork_server.refresh()
    assert looks == [12345, 12345]


def test_a_server_grown_past_the_limit_is_forked_anew(looks: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    server = fork_server._server
    forked: list[str] = []
    monkeypatch.setattr(fork_server, "own_memory", lambda pid: fork_server._REFRESH_ABOVE)
    monkeypatch.setattr(fork_server, "fork_hazards", lambda: [])
    monkeypatch.setattr(fork_server, "fork_from_kernel", lambda: forked.append("new") or IdleServer(pid=2))
    fork_server.refresh(memory=False)
    assert not forked  # a launch does not look
    fork_server.refresh()
    assert forked == ["new"] and server.closed  # type: ignore[union-attr]
