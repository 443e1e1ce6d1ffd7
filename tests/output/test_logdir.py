"""Per-launch log folders: bounded, never pruned while a launch holds them, optional.

Imports internals (output.logdir): it tests those units directly, below the public face.
"""

from __future__ import annotations

from pathlib import Path

from nbaccel.output.logdir import LaunchLogs, default_root, prune


def test_only_the_latest_launches_are_kept(tmp_path: Path) -> None:
    for i in range(30):
        logs = LaunchLogs.create(tmp_path, keep=5)
        assert logs is not None
        logs.write(0, [f"launch {i}"])
        logs.close()
    folders = sorted(p for p in tmp_path.iterdir())
    assert len(folders) == 5
    assert {(p / "rank0.log").read_text() for p in folders} == {f"launch {i}\n" for i in range(25, 30)}


def test_a_recycled_folder_holds_only_its_new_launch_and_counts_as_the_newest(tmp_path: Path) -> None:
    """A launch beyond ``keep`` takes over the oldest folder (renamed, emptied) instead of removing it."""
    first = LaunchLogs.create(tmp_path, keep=2)
    assert first is not None
    first.write(0, ["old"])
    first.write(3, ["old rank 3"])
    (first.path / "extra").mkdir()
    first.close()
    second = LaunchLogs.create(tmp_path, keep=2)
    assert second is not None
    second.close()
    third = LaunchLogs.create(tmp_path, keep=2)  # takes over the first one's folder
    assert third is not None
    assert not first.path.exists()
    assert sorted(p.name for p in third.path.iterdir()) == [".lock"]
    third.write(0, ["new"])
    third.close()
    fourth = LaunchLogs.create(tmp_path, keep=2)  # the second one's folder now: the third stays
    assert fourth is not None
    fourth.close()
    assert {p.name for p in tmp_path.iterdir()} == {third.path.name, fourth.path.name}
    assert (third.path / "rank0.log").read_text() == "new\n"


def test_a_folder_a_running_launch_holds_is_never_pruned(tmp_path: Path) -> None:
    running = LaunchLogs.create(tmp_path, keep=2)
    assert running is not None
    running.write(1, ["still going"])
    for _ in range(5):
        logs = LaunchLogs.create(tmp_path, keep=2)
        assert logs is not None
        logs.close()
    assert running.path.exists()
    running.write(1, ["and on"])
    running.close()
    assert (running.path / "rank1.log").read_text() == "still going\nand on\n"
    assert running.path in prune(tmp_path, keep=1) or not running.path.exists()


def test_a_root_that_cannot_be_written_means_no_logs_not_a_failed_launch(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    assert LaunchLogs.create(blocker / "logs") is None


def test_the_root_comes_from_the_environment_or_the_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("NBACCEL_LOG_DIR", str(tmp_path / "mine"))
    assert default_root() == tmp_path / "mine"
    monkeypatch.delenv("NBACCEL_LOG_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert default_root() == tmp_path / "cache" / "nbaccel" / "logs"
