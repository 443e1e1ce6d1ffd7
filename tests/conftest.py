"""Shared fixtures: every test is bounded in time (scaled by ``nbaccel.testing.time_scale``) and must leave nothing behind.

The autouse leak check compares what this process holds after each test with what it held
before (tests/leak_check.py): processes and zombies, Python threads, open fds, listening TCP
ports. What wider-scoped fixtures hold (a module's kernel) was there before, so it is allowed.
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nbaccel.testing import scaled, time_scale
from tests.leak_check import Resources, become_subreaper, clean_up, leaks, reap_zombie_children

LEAK_GRACE_S = 1.0  # what a test ended may still be finishing: a rank exiting, a thread joining
_POLL_S = 0.05


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "orphans: the test kills a parent on purpose; its ended orphans are reaped, not counted")
    # Orphaned descendants (ranks of a killed kernel) become our children: seen by the leak check, and reaped.
    config.stash[_SUBREAPER] = become_subreaper()
    config.stash[_SIGINT_AT_START] = deliver_sigint()
    _open_process_singletons()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SIGINT_AT_START in config.stash:
        restore_sigint(config.stash[_SIGINT_AT_START])


_SUBREAPER = pytest.StashKey[bool]()
SigintHandling = tuple[object, bool]  # (the handler, whether the main thread blocks SIGINT)
_SIGINT_AT_START = pytest.StashKey[SigintHandling]()


def sigint_handling() -> SigintHandling:
    """This thread's SIGINT handler and whether its signal mask blocks SIGINT."""
    return signal.getsignal(signal.SIGINT), signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, ())


def deliver_sigint() -> SigintHandling:
    """Make SIGINT raise KeyboardInterrupt here, whatever this process started with; return what it had.

    The tests that interrupt a launch send a real SIGINT, as Jupyter's stop button does to a
    kernel (which always installs Python's handler). A process started with SIGINT ignored (a
    shell's ``&``, ``nohup``, CI runners that start jobs in the background) never gets Python's
    ``default_int_handler``: those tests then waited for an interrupt that never came, unless an
    earlier test had happened to install the handler (nbclient's asyncio loop does, on its way
    out). Every process the tests start inherits a handled SIGINT as SIG_DFL across exec, so
    their Python installs the handler too.
    """
    was = sigint_handling()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    return was


def restore_sigint(was: SigintHandling) -> None:
    handler, blocked = was
    if handler is not None:  # None: a handler C code installed, which Python cannot put back
        signal.signal(signal.SIGINT, handler)  # type: ignore[arg-type]  # getsignal's: a callable, SIG_IGN or SIG_DFL
    if blocked:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def _open_process_singletons() -> None:
    """Open now what a library opens once per process and keeps, so no test is blamed for it.

    torch's TCPStore runs on libuv, whose signal handling opens a pipe on the first loop of the
    process and keeps it open for the process's life (the kernel side of every launch makes one).
    jupyter_client's blocking calls run on one asyncio loop per thread that jupyter_core keeps
    (an epoll fd and a socket pair): the first test driving a kernel would be blamed for it.
    """
    import torch.distributed as dist
    from jupyter_core.utils import ensure_event_loop

    if dist.is_available():
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        del store
    ensure_event_loop()


@pytest.fixture(autouse=True)
def sigint_kept() -> Iterator[None]:
    """Fail a test that leaves SIGINT's handler or the main thread's mask changed: the tests after
    it would depend on it (an interrupt lost, or raised where none was sent)."""
    before = sigint_handling()
    yield
    after = sigint_handling()
    if after != before:
        restore_sigint(before)
        pytest.fail(f"test left SIGINT's handling changed: (handler, blocked) {before!r} became {after!r}", pytrace=False)


@pytest.fixture(autouse=True)
def no_leaks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that leaves a process, zombie, thread, fd or listening port behind."""
    before = Resources.now()
    if any(d.zombie and d.ppid == os.getpid() for d in before.descendants):
        reap_zombie_children()  # orphans of a wider fixture's teardown: not this test's doing
        before = Resources.now()
    yield
    orphans_expected = request.node.get_closest_marker("orphans") is not None
    deadline = time.monotonic() + scaled(LEAK_GRACE_S)
    while True:
        after = Resources.now()
        found = leaks(before, after, orphans_expected)
        if not found or time.monotonic() > deadline:
            break
        time.sleep(_POLL_S)
    clean_up(before, after)
    if found:
        pytest.fail("test left behind:\n  " + "\n  ".join(found), pytrace=False)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _mark_tiers(items)
    _scale_timeouts(config, items)
    _skip_gpu_tests_without_a_gpu(items)


TESTS = Path(__file__).resolve().parent
# The tiers (CONTRIBUTING.md says which to run when); each test has the marker of its own:
TIER_OF_FOLDER = {"agent": "nodes", "kernel": "kernel", "browser": "browser", "examples": "examples", "gpu": "gpu"}
STATIC = frozenset({"test_static.py", "test_layers.py", "test_docs.py", "test_packaging.py"})  # mypy, ruff, sphinx, build as subprocesses
NOT_QUICK = frozenset({"slow", "kernel", "browser", "gpu", "cluster", "nodes", "static", "examples"})


def _mark_tiers(items: list[pytest.Item]) -> None:
    """``nodes`` (tests/agent), ``kernel``, ``browser``, ``examples``, ``gpu`` by folder; ``static``
    for the checks that run tools; ``slow`` for a test run with spawn (a fresh interpreter
    importing torch per rank, a second or more a launch); ``quick`` for every other test: the
    unit and one-node multi-process tier of the edit-test loop (``./dev test -m quick``)."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if not path.is_relative_to(TESTS):  # the package's doctests (tests/test_static.py runs them)
            continue
        parts = path.relative_to(TESTS).parts
        tier = TIER_OF_FOLDER.get(parts[0]) if len(parts) > 1 else ("static" if parts[0] in STATIC else None)
        if tier is not None:
            item.add_marker(tier)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and "spawn" in callspec.id.split("-"):
            item.add_marker("slow")
        if not any(item.get_closest_marker(name) is not None for name in NOT_QUICK):
            item.add_marker("quick")


def _scale_timeouts(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test's time limit (its timeout marker, else the configured one) times ``time_scale()``."""
    scale = time_scale()
    if scale == 1.0:
        return
    configured = config.getoption("timeout", None) or config.getini("timeout") or 0
    for item in items:
        marker = item.get_closest_marker("timeout")
        settings = dict(marker.kwargs) if marker else {}
        limit = marker.args[0] if marker and marker.args else settings.pop("timeout", configured)
        if float(limit) > 0:
            item.add_marker(pytest.mark.timeout(float(limit) * scale, **settings), append=False)


def _skip_gpu_tests_without_a_gpu(items: list[pytest.Item]) -> None:
    """Skip GPU tests where no CUDA device is visible."""
    try:
        import torch

        have_gpu = torch.cuda.device_count() > 0
    except (ImportError, RuntimeError):  # torch missing or its CUDA broken: the GPU tier cannot run
        have_gpu = False
    if have_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("NBACCEL_OUTPUT", "text")


_CGROUP_V1 = Path("/sys/fs/cgroup/memory")


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A fresh cgroup v1 memory controller limited to 300 MiB (root only; skipped otherwise), for
    ranks that move themselves in to be taken by the real OOM killer."""
    if not os.access(_CGROUP_V1, os.W_OK):
        pytest.skip("needs a writable cgroup v1 memory controller (root) to set a limit for the test")
    folder = _CGROUP_V1 / f"nbaccel-test-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    (folder / "memory.limit_in_bytes").write_text(str(300 * 2**20))
    yield folder
    for _ in range(50):  # the killed rank leaves the cgroup once reaped
        try:
            folder.rmdir()
            break
        except OSError:
            time.sleep(0.1)
