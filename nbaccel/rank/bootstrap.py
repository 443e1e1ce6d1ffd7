"""What a rank does after it is started: become a rank, run the function, report, exit.

The same code serves forked ranks (called in the child right after ``os.fork``) and spawned ones
(called by ``nbaccel.rank.spawn_entry`` after it unpickles the job).

Example (what ForkStarter does)::

    pid = os.fork()
    if pid == 0:
        run_rank(job, rank=0, env=env, ends=child_ends, close_fds=[], parent_pid=kernel_pid)
"""

from __future__ import annotations

import _signal
import bdb
import ctypes
import faulthandler
import os
import select
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple, NoReturn

from nbaccel.rank import accelerate_world, cpu_threads, debugger, exit_hooks, heavy_imports, memory_errors, process_identity, process_title, stack_dump
from nbaccel.rank import display_hooks as rank_hooks
from nbaccel.rank.capture import _libc, flush_all, redirect_stdio
from nbaccel.wire import events, shm
from nbaccel.wire.job import ChildEnds, Job, job_label

_EXIT_SETUP_FAILED = 70  # EX_SOFTWARE: nbaccel itself could not set the rank up
_EXIT_INTERRUPTED = 130
_EXIT_RAISED = 1
# How long a rank that raised stays (its process group's connections open) while the kernel takes
# its peers' stacks: without it a peer blocked in a collective dies of "connection closed" first.
_HOLD_FOR_STACKS = 2.0
_PR_SET_PDEATHSIG = 1
_DEFAULT_SIGNALS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP", "SIGQUIT", "SIGCHLD", "SIGUSR1", "SIGUSR2") if hasattr(signal, name))
_SIGNALS_NBACCEL_SENDS = {signal.SIGINT.value, signal.SIGTERM.value, stack_dump.STACK_SIGNAL.value}  # ints: _signal takes no enums
# Resolved in the kernel, once: a lookup in every rank would cost it a dlsym and dirty pages.
_prctl = getattr(_libc, "prctl", None) if sys.platform.startswith("linux") else None


def run_rank(
    job: Job | bytes, rank: int, env: dict[str, str], ends: ChildEnds, close_fds: list[int], parent_pid: int, prepared: PreparedEnvironment | None = None
) -> NoReturn:
    """Run ``job`` as ``rank`` and exit the process; never returns into the caller's code.

    A job given as bytes (nbaccel.wire.job_pickle: spawn, the fork server) is loaded once the
    rank's device is pinned, so captured CUDA tensors land on the rank's own GPU. ``prepared``
    (``prepare_environment(env)``, made by the parent just before the fork) sets the
    environment in two assignments instead of one ``putenv`` per variable, and may carry what
    else the parent made for this rank (its stack dump file, its CPU threads).
    """
    exit_code = _EXIT_SETUP_FAILED
    modules_at_start = heavy_imports.present_at_start()
    try:
        _detach_from_kernel(parent_pid, close_fds)
        if prepared is not None and prepared.title is not None:
            process_title.set_encoded(prepared.title)
        else:
            _name_process(job, rank, env)
        redirect_stdio(ends.stdout, ends.stderr)
        faulthandler.enable(file=2, all_threads=True)  # a segfault leaves a Python stack (fd 2: sys.stderr's, without its flush)
        _set_environment(env, prepared)
        stack_dump.install(env.get(stack_dump.STACK_FILE_VARIABLE), prepared.stack_fd if prepared is not None else None)
        _forget_kernel_state()
        exit_hooks.start(parent_pid)  # multiprocessing's after-fork work; the kernel's atexit set aside
        _pin_device(env)
        _share_cores(env, prepared)
        accelerate_world.install(env.get("NBACCEL_DEVICE_TYPE"))
        rank_hooks.install(ends.channel)
        debugger.install(rank, ends.channel, ends.commands)
        process_identity.become_rank()  # no interactive shell left for libraries to see (after the hooks' own)
        shm.use_rank_mailbox(ends.shared)
        if isinstance(job, bytes):
            from nbaccel.wire.job_pickle import load_job

            loaded = load_job(job, shm.rank_mailbox())
            _name_process(loaded, rank, env)
            exit_code = execute(loaded, ends)
        else:
            exit_code = execute(job, ends)
        _report_imports(modules_at_start, ends.channel)
    except BaseException:  # noqa: BLE001 - a rank must never fall back into the kernel's stack
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - stderr itself may be gone: the exit code still tells
            pass
    finally:
        _finish(exit_code)


def _finish(exit_code: int) -> NoReturn:
    """The rank's own exit handlers (bounded), then out, without the kernel's."""
    try:
        flush_all()
        exit_hooks.finish(exit_code)
    except BaseException:  # noqa: BLE001 - the exit code is decided: an error in a handler must not change it
        try:
            traceback.print_exc()
        except BaseException:  # noqa: BLE001 - stderr itself may be gone
            pass
    finally:
        flush_all()
        os._exit(exit_code)


def _detach_from_kernel(parent_pid: int, close_fds: list[int]) -> None:
    """Own pgid (POSIX process group), die with the kernel, default signal handlers, no kernel fds."""
    try:
        os.setpgid(0, 0)
    except OSError:  # already a group or session leader (spawned with start_new_session)
        pass
    if _prctl is not None:
        # The kernel may die by SIGKILL (a restart, the OOM killer): take the rank down with it.
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent_pid:  # it died before prctl took effect
            os._exit(_EXIT_SETUP_FAILED)
    # _signal's own functions: signal.signal wraps each old handler in an enum, objects a rank
    # would make (and pages it would copy from the kernel) only to drop them.
    _signal.signal(signal.SIGINT, _signal.default_int_handler)
    for number in _DEFAULT_SIGNALS:
        if _signal.getsignal(number) != _signal.SIG_DFL:
            _signal.signal(number, _signal.SIG_DFL)
    # A signal mask survives fork and exec: a kernel or agent started with these blocked (or
    # forking while it holds SIGINT back) would give ranks that nbaccel's interrupt, stop and
    # stack request never reach.
    _signal.pthread_sigmask(_signal.SIG_UNBLOCK, _SIGNALS_NBACCEL_SENDS)
    for fd in close_fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _name_process(job: Job | bytes, rank: int, env: dict[str, str]) -> None:
    """``nbaccel rank 1/4 (cell [12])`` in ps, top and nvidia-smi. A job still in bytes is named
    again once loaded; one passed its pipe ends is nbaccel's own loop (a worker's, a node's job
    by value), which names the process itself."""
    process_title.set_title(*rank_names(job, rank, env))


def rank_names(job: Job | bytes, rank: int, env: dict[str, str]) -> tuple[str, str]:
    """The title and comm of ``rank`` running ``job`` (``process_title.rank_title``'s words, made
    here: every function a fresh rank runs copies its code's page; a fork starter encodes them
    in the parent, before the fork).

    Example:
        >>> rank_names(b"", 1, {"WORLD_SIZE": "4"})
        ('nbaccel rank 1/4', 'nbaccel-r1/4')
    """
    label = None if isinstance(job, bytes) or job.pass_ends else job.label or job_label(job.function)
    world = env.get("WORLD_SIZE", "1")
    return f"nbaccel rank {rank}/{world} ({label})" if label else f"nbaccel rank {rank}/{world}", f"nbaccel-r{rank}/{world}"


class PreparedEnvironment(NamedTuple):
    """A rank's whole environment, made in the parent before the fork: the child only points
    the C ``environ`` at ``block`` and ``os.environ`` at ``data``, writing none of the
    kernel's pages that 28 ``putenv`` calls (malloc, the environ array, new str and bytes
    objects) would copy."""

    data: dict[bytes, bytes]  # os.environ._data once updated
    block: Any  # a NULL-terminated ctypes array of "KEY=VALUE" (it keeps the bytes alive)
    # Decided in the parent: the OMP_NUM_THREADS put in the block (0: the rank keeps its own;
    # None: the rank decides, see cpu_threads.share_cores) ...
    threads: int | None = None
    # ... and the rank's stack dump file, opened there (stack_dump.open_for_rank; None: the rank opens it).
    stack_fd: int | None = None
    address: int = 0  # the block's, taken in the parent: ctypes.addressof in the child copied ~10 pages
    title: tuple[bytes, bytes] | None = None  # process_title.encode_title's (None: the rank names itself)


_FS_ENCODING = sys.getfilesystemencoding()
# The C environ pointer, looked up in the kernel once; None where libc's is not reachable.
try:
    _ENVIRON: Any = ctypes.c_void_p.in_dll(_libc, "environ") if _libc is not None and sys.platform.startswith("linux") else None
except ValueError:  # a libc without the symbol exported
    _ENVIRON = None


def prepare_environment(env: dict[str, str]) -> PreparedEnvironment | None:
    """Parent side: the environment a rank with ``env`` will have, as one block; None where the
    C environment cannot be replaced (the rank then sets each variable).

    The C block starts from the C environment itself (a library may have set a variable that
    ``os.environ`` never saw), each of ``env``'s variables replacing or adding an entry.

    Example:
        >>> prepared = prepare_environment({"RANK": "3"})
        >>> prepared is None or prepared.data[b"RANK"] == b"3"
        True
    """
    if _ENVIRON is None or not _ENVIRON.value:
        return None
    try:
        return _environment_block(env)
    except Exception:  # noqa: BLE001 - a value that is not a str, say: the rank sets each variable, and fails as before
        return None


def _environment_block(env: dict[str, str]) -> PreparedEnvironment:
    data = dict(os.environ._data)  # type: ignore[attr-defined]
    entries: dict[bytes, bytes] = {}
    pointers = ctypes.cast(_ENVIRON.value, ctypes.POINTER(ctypes.c_char_p))
    index = 0
    while (entry := pointers[index]) is not None:
        entries.setdefault(entry.partition(b"=")[0], entry)  # getenv reads the first of a name
        index += 1
    for key, value in env.items():
        # What os.environ's encodekey/encodevalue do, without their calls (the kernel pays this per rank).
        encoded_key, encoded_value = key.encode(_FS_ENCODING, "surrogateescape"), value.encode(_FS_ENCODING, "surrogateescape")
        data[encoded_key] = encoded_value
        entries[encoded_key] = encoded_key + b"=" + encoded_value
    block = (ctypes.c_char_p * (len(entries) + 1))(*entries.values(), None)
    return PreparedEnvironment(data, block, address=ctypes.addressof(block))


def _set_environment(env: dict[str, str], prepared: PreparedEnvironment | None = None) -> None:
    """``os.environ.update(env)``: from a prepared block, or for each variable what
    ``os.environ[key] = value`` does, the C environment first, without the mapping machinery
    of ``MutableMapping.update`` (whose code and objects a fresh rank would copy)."""
    if prepared is not None and _ENVIRON is not None:
        _ENVIRON.value = prepared.address or ctypes.addressof(prepared.block)
        os.environ._data = prepared.data  # type: ignore[attr-defined]
        return
    data, encode_key, encode_value = os.environ._data, os.environ.encodekey, os.environ.encodevalue  # type: ignore[attr-defined]
    for key, value in env.items():
        os.putenv(key, value)
        data[encode_key(key)] = encode_value(value)


def _forget_kernel_state() -> None:
    """Drop process state a fork copied from the kernel (a notebook PartialState, say)."""
    # Only a state the kernel holds is reset: assigning a class attribute (even None over None)
    # invalidates the type caches of the class and its subclasses, pages a rank would copy.
    if any(_holds(*state) for state in _KERNEL_STATES):
        from nbaccel.state import reset_all_states

        reset_all_states()
    acc_state = sys.modules.get("accelerate.state")
    if acc_state is not None:
        try:
            if any(getattr(acc_state, name)._shared_state for name in ("AcceleratorState", "PartialState", "GradientState")):
                acc_state.AcceleratorState._reset_state(True)
                acc_state.GradientState._reset_state()
        except Exception:  # noqa: BLE001 - best effort: only older/newer Accelerate lacks these
            pass
    # torch's cached device count needs no reset: torch (>= 2.1) caches it only once CUDA is
    # initialised, and a process with CUDA initialised is never forked (launch/preflight.py).


# (module, class, attribute): where nbaccel's state API keeps what a kernel set up; None when nothing.
_KERNEL_STATES = (
    ("nbaccel.state.partial", "PartialState", "_shared"),
    ("nbaccel.state.accelerator", "AcceleratorState", "_config"),
    ("nbaccel.state.gradient", "GradientState", "_shared"),
)


def _holds(module_name: str, class_name: str, attribute: str) -> bool:
    module = sys.modules.get(module_name)
    return module is not None and getattr(getattr(module, class_name, None), attribute, None) is not None


def _share_cores(env: dict[str, str], prepared: PreparedEnvironment | None) -> None:
    """The rank's CPU threads: as the parent decided them (``prepared``), or decided here."""
    local_world_size = int(env.get("LOCAL_WORLD_SIZE", "1"))
    if prepared is None:
        cpu_threads.share_cores(local_world_size)
    else:
        cpu_threads.share_cores(local_world_size, prepared.threads, bool(env.get(cpu_threads.ONE_THREAD_VARIABLE)))


def _pin_device(env: dict[str, str]) -> None:
    """A GPU rank's own device current before any user code: ``cuda:N`` (NVIDIA, AMD) or ``xpu:N``."""
    kind = env.get("NBACCEL_DEVICE_TYPE")
    if kind in ("cuda", "xpu"):
        import torch

        getattr(torch, kind).set_device(int(env.get("NBACCEL_DEVICE_INDEX") or env["LOCAL_RANK"]))


def execute(job: Job, ends: ChildEnds) -> int:
    """Call the function, send its result or its error on the channel; the exit code."""
    args = (ends, *job.args) if job.pass_ends else job.args
    code = call_and_report(lambda: job.function(*args), ends.channel)
    if code == 0:
        _leave_process_group(ends.commands)
    elif code == _EXIT_RAISED:
        _hold_for_stacks(ends.commands)
    return code


def _hold_for_stacks(commands: int | None) -> None:
    """Wait (bounded) for the kernel's word that the peers' stacks are taken."""
    if commands is not None:
        select.select([commands], [], [], _HOLD_FOR_STACKS)


def call_and_report(call: Callable[[], Any], channel_fd: int) -> int:
    """Run ``call``; send RESULT (its value) or ERROR on the channel. 0 when it returned.

    Otherwise the exit code a rank that ended this way should have: 1 for an exception,
    130 for KeyboardInterrupt, the code of a SystemExit (whose code 0 counts as returning None).
    """
    try:
        value = call()
        rank_hooks.finish()  # figures still open are shown, as at the end of a cell
    except SystemExit as exc:
        code = _exit_code(exc)
        if code != 0:
            return code
        value = None
    except KeyboardInterrupt as exc:
        _send_error(channel_fd, exc)
        return _EXIT_INTERRUPTED
    except BaseException as exc:  # noqa: BLE001 - everything a rank raises is reported
        debugger.remember_failure(exc)
        _send_error(channel_fd, exc)
        return _EXIT_RAISED
    mailbox = shm.rank_mailbox()
    attached = shm.Attachments() if mailbox is not None else None
    try:
        payload = events.dumps(value, attached)
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        if attached is not None:
            attached.close()
        _send_unpicklable(channel_fd, value, exc)
        return 1
    if mailbox is not None and attached is not None:
        mailbox.post(attached)  # before the frame that names them: the kernel finds them there
    events.send_bytes(channel_fd, events.Kind.RESULT, payload)
    return 0


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)  # sys.exit("message") prints the message, as Python does
    return 1


def _send_error(channel_fd: int, exc: BaseException) -> None:
    # Skip nbaccel's own frames: the traceback starts in the user's code.
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_globals.get("__name__", "").startswith("nbaccel."):
        tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    message = "quit in the debugger" if isinstance(exc, bdb.BdbQuit) else str(exc)
    memory = memory_errors.note(exc)  # an out-of-memory error names the rank, device and peak
    if memory:
        message = f"{message} ({memory})" if message else memory
    events.send(
        channel_fd,
        events.Kind.ERROR,
        {"type_name": type(exc).__qualname__, "message": message, "traceback": text, "timestamp": time.time()},
    )


def _send_unpicklable(channel_fd: int, value: Any, exc: Exception) -> None:
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    message = (
        f"the return value (a {kind}) cannot be pickled to send it back to the kernel: {exc}. "
        "Return plain data instead (numbers, lists, dicts, CPU tensors, state_dict()), "
        "or save it to a file and return the path."
    )
    events.send(
        channel_fd,
        events.Kind.ERROR,
        {"type_name": "UnpicklableResultError", "message": message, "traceback": "", "timestamp": time.time()},
    )


def _report_imports(at_start: set[str], channel_fd: int) -> None:
    imported = heavy_imports.imported_by_rank(at_start)
    if imported:
        events.send(channel_fd, events.Kind.IMPORTED, sorted(imported))


def _leave_process_group(release_fd: int | None) -> None:
    """Tear down a process group the function created (the launcher owns teardown).

    First wait for the kernel's word that every rank has returned: a rank that leaves while a
    peer is still connecting its gloo mesh makes that peer fail ("Connection closed by peer").
    The kernel kills the waiting ranks instead if another rank fails, so this never hangs.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    if release_fd is not None:
        os.read(release_fd, 1)
    dist.destroy_process_group()
