"""The leak check catches every kind of leak it claims to: each test below leaks one on purpose."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from nbaccel.testing import scaled
from tests.kernel_harness import wait_until
from tests.leak_check import Resources, clean_up, leaks, reap_zombie_children

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parent.parent


def python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)])


def zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def before() -> Iterator[Resources]:
    """The snapshot to compare with; afterwards, what the test leaked on purpose is cleaned up."""
    snapshot = Resources.now()
    yield snapshot
    clean_up(snapshot, Resources.now())


def test_nothing_new_is_no_leak(before: Resources) -> None:
    assert leaks(before, Resources.now()) == []


def test_a_process_left_running_is_caught_and_clean_up_kills_it(before: Resources) -> None:
    child = python("import time; time.sleep(60)")
    found = leaks(before, Resources.now())
    assert found == [f"process pid {child.pid} (python) still running"]
    clean_up(before, Resources.now())  # killed, and reaped (so the next test starts clean)
    wait_until(lambda: not psutil.pid_exists(child.pid), 5, "the leaked process killed and reaped")


def test_a_child_never_waited_for_is_a_zombie_unless_orphans_are_expected(before: Resources) -> None:
    child = python("pass")
    wait_until(lambda: zombie(child.pid), 10, "the child ended")
    assert leaks(before, Resources.now()) == [f"zombie pid {child.pid} (python): our child, exited, never waited for"]
    assert leaks(before, Resources.now(), orphans_expected=True) == []
    assert reap_zombie_children() == [child.pid]


def test_a_zombie_its_parent_never_waited_for_is_caught(before: Resources) -> None:
    parent = python("""
        import os, time
        if os.fork() == 0:
            os._exit(0)
        time.sleep(60)
    """)
    wait_until(lambda: any(zombie(c.pid) for c in psutil.Process(parent.pid).children()), 10, "the grandchild ended")
    [grandchild] = psutil.Process(parent.pid).children()
    assert f"zombie pid {grandchild.pid} (python): exited, never waited for by its parent pid {parent.pid}" in leaks(before, Resources.now())


def test_an_orphan_is_reparented_to_the_test_process_and_caught(before: Resources) -> None:
    parent = python("""
        import subprocess, sys
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    """)
    assert parent.wait(timeout=scaled(10)) == 0  # it ended, its child did not
    [orphan] = [d for d in Resources.now().new_descendants(before) if not d.zombie]
    assert orphan.ppid == os.getpid()  # the subreaper's, not init's: still seen
    assert leaks(before, Resources.now()) == [f"process pid {orphan.pid} (python) still running"]


def test_a_thread_left_running_is_caught(before: Resources) -> None:
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="left-behind", daemon=True)
    thread.start()
    try:
        assert leaks(before, Resources.now()) == ["thread 'left-behind' (daemon) still running"]
    finally:
        stop.set()
        thread.join()
    assert leaks(before, Resources.now()) == []


def test_an_open_fd_is_caught(before: Resources) -> None:
    read_end, write_end = os.pipe()
    try:
        found = leaks(before, Resources.now())
        assert [line.split(" -> ")[0] for line in found] == [f"fd {read_end}", f"fd {write_end}"]
        assert all("pipe:[" in line for line in found)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_listening_port_is_caught_once_not_as_an_fd_too(before: Resources) -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert leaks(before, Resources.now()) == [f"listening on TCP port {port}"]
    with socket.socket() as unbound:  # a socket that does not listen is an fd
        assert leaks(before, Resources.now()) == [f"fd {unbound.fileno()} -> {os.readlink(f'/proc/self/fd/{unbound.fileno()}')} still open"]


@pytest.mark.slow
def test_the_autouse_check_fails_a_leaking_test_and_passes_a_clean_one(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_inner.py").write_text(
        textwrap.dedent("""
        import os, subprocess, sys, threading, time
        import pytest

        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_leaks_a_process():
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

        def test_leaks_a_pipe():
            os.pipe()

        ORPHAN = "import os, time\\nparent = os.getpid()\\npid = os.fork()\\nif pid == 0:\\n    while os.getppid() == parent:\\n        time.sleep(0.01)\\n    os._exit(0)\\nprint(pid, flush=True)"

        @pytest.mark.orphans
        def test_kills_a_parent_on_purpose():
            parent = subprocess.Popen([sys.executable, "-c", ORPHAN], stdout=subprocess.PIPE, text=True)
            orphan = int(parent.stdout.readline())  # it ends once its parent is gone
            parent.wait()
            parent.stdout.close()
            deadline = time.monotonic() + 30
            while not ended(orphan):
                assert time.monotonic() < deadline, "the orphan did not end"
                time.sleep(0.01)
            # the orphan ended: a zombie of ours, reaped, not counted

        def ended(pid):
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
            except FileNotFoundError:
                return True
    """)
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(50),
        check=False,
    )
    report = run.stdout
    assert "PASSED test_inner.py::test_clean" in report and "PASSED test_inner.py::test_kills_a_parent_on_purpose" in report, report
    assert "ERROR test_inner.py::test_leaks_a_process" in report and "ERROR test_inner.py::test_leaks_a_pipe" in report, report
    assert "test left behind:\n  process pid " in report and "-> pipe:[" in report, report


def test_a_file_left_in_dev_shm_is_a_leak(before: Resources) -> None:
    path = Path("/dev/shm") / f"nbaccel-leak-test-{os.getpid()}"
    path.write_bytes(b"x")
    try:
        assert f"/dev/shm/{path.name} left in shared memory" in leaks(before, Resources.now())
    finally:
        path.unlink()
    assert leaks(before, Resources.now()) == []
