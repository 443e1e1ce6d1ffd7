"""pdb on real forked ranks on gloo, the kernel's stdin stood in for by a scripted one.

The real kernel's stdin (input_request) is exercised in tests/kernel/test_debugger_kernel.py;
here the desk's ``kernel_stdin`` answers from a list, so every path of the rank's debugger and
of the desk's turns runs on real ranks without a kernel.

Imports internals (launch, output): it tests those units directly, below the public face.
"""

from __future__ import annotations

import io
import os
import threading
import time
import warnings
from collections.abc import Callable, Iterator

import psutil
import pytest

import nbaccel
from nbaccel.launch import debug_desk
from nbaccel.launch.starters import fork_server
from nbaccel.output.sinks import TextSink
from nbaccel.testing import CollectingSink, scaled
from tests.handshake import mark, wait_for, wait_until_blocked

pytestmark = pytest.mark.timeout(90)


class ScriptedStdin:
    """Answers each prompt with the next line; records the prompts (called from the desk's thread)."""

    def __init__(self, lines: list[str], delay: float = 0.0) -> None:
        self.lines, self.delay, self.prompts = list(lines), delay, []  # type: ignore[var-annotated]
        self.threads: set[str] = set()

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay)
        if not self.lines:
            raise AssertionError(f"no answer left for {prompt!r}")
        return self.lines.pop(0)


@pytest.fixture
def stdin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., ScriptedStdin]]:
    made: list[ScriptedStdin] = []

    def make(lines: list[str], delay: float = 0.0) -> ScriptedStdin:
        scripted = ScriptedStdin(lines, delay)
        monkeypatch.setattr(debug_desk, "kernel_stdin", lambda: scripted)
        made.append(scripted)
        return scripted

    yield make  # the autouse leak check (tests/leak_check.py) fails a test that leaves a rank


def stop_on_rank_one() -> int:
    x = int(os.environ["RANK"]) * 10 + 7
    if x == 17:
        breakpoint()
    return x + 1


def test_a_breakpoint_prompts_with_the_ranks_name_and_runs_commands_in_its_frame(stdin: Callable[..., ScriptedStdin]) -> None:
    scripted = stdin(["p x", "x = 100", "c"])
    sink = CollectingSink()
    assert nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, output=sink) == [8, 101]
    assert scripted.prompts[0].startswith("nbaccel: rank 1 is at a breakpoint")
    assert scripted.prompts[1] == "17\n(Pdb) rank 1> "
    assert "17" in sink.text(1) and "-> return x + 1" in sink.text(1)  # pdb's output is in rank 1's view
    assert scripted.threads == {"nbaccel-stdin-rank-1"}


def test_in_text_output_pdbs_lines_are_the_ranks_lines_and_are_not_repeated_in_the_prompt(stdin: Callable[..., ScriptedStdin]) -> None:
    scripted = stdin(["p x", "c"])
    cell = io.StringIO()
    assert nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, output=TextSink(stdout=cell)) == [8, 18]
    first, second = scripted.prompts
    assert first.startswith("nbaccel: rank 1 is at a breakpoint") and first.count("\n") == 1 and first.endswith("\n(Pdb) rank 1> ")
    assert second == "(Pdb) rank 1> "
    said = [line for line in cell.getvalue().splitlines() if line.startswith("[rank 1] ")]
    assert said[1:] == ["[rank 1] -> return x + 1", "[rank 1] 17"] and said[0].endswith("stop_on_rank_one()")


def test_pythonbreakpoint_0_skips_and_another_value_is_called(stdin: Callable[..., ScriptedStdin]) -> None:
    scripted = stdin([])

    def hooks() -> str:
        os.environ["PYTHONBREAKPOINT"] = "0"
        breakpoint()  # nothing
        os.environ["PYTHONBREAKPOINT"] = "builtins.print"
        breakpoint("hooked", os.environ["RANK"])  # print("hooked", rank): arguments reach the hook
        os.environ["PYTHONBREAKPOINT"] = "no_such_module_xyz.hook"
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            breakpoint()  # a RuntimeWarning, as Python gives, and no stop
        return str(seen[0].message)

    sink = CollectingSink()
    assert nbaccel.notebook_launcher(hooks, num_processes=2, output=sink) == ["Ignoring unimportable $PYTHONBREAKPOINT: 'no_such_module_xyz.hook'"] * 2
    assert scripted.prompts == []
    assert "hooked 1" in sink.text(1)


def test_without_stdin_a_breakpoint_is_one_line_and_the_rank_goes_on() -> None:
    sink = CollectingSink()  # no kernel here: kernel_stdin() finds none
    assert nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, output=sink) == [8, 18]
    said = [line for line in sink.text(1) if "passed a breakpoint" in line]
    assert said == [
        f"nbaccel: rank 1 passed a breakpoint at {__file__}, line {stop_on_rank_one.__code__.co_firstlineno + 4} without stopping: {debug_desk.NO_STDIN}"
    ]
    assert psutil.Process().children() == []


def test_input_on_a_rank_is_a_prompt_too(stdin: Callable[..., ScriptedStdin]) -> None:
    scripted = stdin(["yes"])

    def ask() -> str:
        return input("continue? ") if os.environ["RANK"] == "1" else "rank 0"

    assert nbaccel.notebook_launcher(ask, num_processes=2, output=CollectingSink()) == ["rank 0", "yes"]
    assert scripted.prompts == ["continue? "]


def test_q_fails_the_launch_naming_the_rank(stdin: Callable[..., ScriptedStdin]) -> None:
    stdin(["q"])
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: BdbQuit: quit in the debugger"):
        nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, output=CollectingSink())


@pytest.mark.slow
def test_the_timeout_stands_still_while_a_rank_is_at_the_prompt(stdin: Callable[..., ScriptedStdin]) -> None:
    scripted = stdin(["c"], delay=scaled(2.5))
    assert nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, timeout=scaled(2.0), stall_report=0.5, output=CollectingSink()) == [8, 18]
    assert len(scripted.prompts) == 1


def raise_after_a_collective_on_rank_one() -> None:
    import torch
    import torch.distributed as dist

    state = nbaccel.PartialState()
    dist.barrier()
    if state.process_index == 1:
        local = 41
        raise ValueError(f"bad {local}")
    dist.all_reduce(torch.ones(1))


def test_post_mortem_runs_in_the_failing_ranks_frame_while_peers_wait(stdin: Callable[..., ScriptedStdin]) -> None:
    scripted = stdin(["p local + 1", "w", "q"])
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: bad 41") as caught:
        nbaccel.notebook_launcher(raise_after_a_collective_on_rank_one, num_processes=2, pdb=True, output=CollectingSink())
    assert scripted.prompts[0].startswith("nbaccel: rank 1 raised ValueError: bad 41; post-mortem in its frame")
    assert scripted.prompts[1].startswith("42\n")
    assert "raise_after_a_collective_on_rank_one" in scripted.prompts[2]
    assert "rank 0: in `dist.all_reduce`" in str(caught.value)  # held, not stopped, during the post-mortem


def test_pdb_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="pdb must be True or False, got 'yes'"):
        nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, pdb="yes")  # type: ignore[arg-type]


class NeverAnswers:
    """A prompt nobody answers: waits in short steps, as ipykernel's stdin does (so it can be withdrawn).
    Once asked, and once the prompting rank (its pid in ``asking``) waits for the answer, it
    creates ``prompted``: the other ranks see that the rank is at its prompt."""

    def __init__(self, asking: str, prompted: str) -> None:
        self.prompts: list[str] = []
        self.asking, self.prompted = asking, prompted

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        wait_until_blocked(self.asking)  # it sent the prompt: next, it blocks reading the answer
        mark(self.prompted)
        while True:
            time.sleep(0.01)


def fail_on_rank_zero_once_rank_one_prompts(asking: str, prompted: str) -> None:
    if os.environ["RANK"] == "1":
        mark(asking)
        breakpoint()
        return
    wait_for(prompted)  # rank 1 waits at its prompt
    raise RuntimeError("rank 0 gives up")


def test_a_peers_failure_while_a_rank_is_at_the_prompt_ends_the_launch_and_withdraws_it(monkeypatch: pytest.MonkeyPatch, tmp_path: os.PathLike[str]) -> None:
    asking, prompted = os.path.join(tmp_path, "asking"), os.path.join(tmp_path, "prompted")
    never = NeverAnswers(asking, prompted)
    monkeypatch.setattr(debug_desk, "kernel_stdin", lambda: never)
    started = time.monotonic()
    with pytest.raises(nbaccel.RankFailedError, match="rank 0 failed: RuntimeError: rank 0 gives up") as caught:
        nbaccel.notebook_launcher(fail_on_rank_zero_once_rank_one_prompts, (asking, prompted), num_processes=2, output=CollectingSink())
    assert len(never.prompts) == 1
    assert "rank 1: at its debugger prompt" in str(caught.value)
    assert time.monotonic() - started < scaled(10)
    assert not [t for t in threading.enumerate() if t.name.startswith("nbaccel-stdin")]


@pytest.fixture(params=["spawn", "forkserver"])
def start_method(request: pytest.FixtureRequest) -> Iterator[str]:
    """Ranks started as fresh interpreters, or forked by nbaccel's fork server (ended afterwards)."""
    yield request.param
    fork_server.shutdown()  # the server a "forkserver" launch started; nothing for "spawn"


def test_a_breakpoint_and_q_under_spawn_and_the_fork_server(stdin: Callable[..., ScriptedStdin], start_method: str) -> None:
    scripted = stdin(["p x", "x = 100", "c", "q"])
    sink = CollectingSink()
    assert nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, start_method=start_method, output=sink) == [8, 101]
    assert scripted.prompts[0].startswith("nbaccel: rank 1 is at a breakpoint") and scripted.prompts[1] == "17\n(Pdb) rank 1> "
    assert "-> return x + 1" in sink.text(1)
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: BdbQuit: quit in the debugger"):
        nbaccel.notebook_launcher(stop_on_rank_one, num_processes=2, start_method=start_method, output=CollectingSink())
    assert scripted.lines == []


def test_post_mortem_under_spawn_and_the_fork_server(stdin: Callable[..., ScriptedStdin], start_method: str) -> None:
    scripted = stdin(["p local + 1", "q"])
    with pytest.raises(nbaccel.RankFailedError, match="rank 1 failed: ValueError: bad 41") as caught:
        nbaccel.notebook_launcher(raise_after_a_collective_on_rank_one, num_processes=2, start_method=start_method, pdb=True, output=CollectingSink())
    assert scripted.prompts[0].startswith("nbaccel: rank 1 raised ValueError: bad 41; post-mortem in its frame")
    assert scripted.prompts[1].startswith("42\n")
    assert "rank 0: in `dist.all_reduce`" in str(caught.value)


def fail_on_rank_zero() -> None:
    if os.environ["RANK"] == "0":
        kept = "rank zero's"
        raise LookupError(kept)


def test_persistent_workers_under_spawn_and_the_fork_server(stdin: Callable[..., ScriptedStdin], start_method: str) -> None:
    scripted = stdin(["p x", "c", "p kept", "q"])
    with nbaccel.start_workers(num_processes=2, start_method=start_method) as pool:
        assert pool.run(stop_on_rank_one, output=CollectingSink()) == [8, 18]
        assert scripted.prompts[0].startswith("nbaccel: rank 1 is at a breakpoint") and scripted.prompts[1] == "17\n(Pdb) rank 1> "
        with pytest.raises(nbaccel.RankFailedError, match="rank 0 failed: LookupError"):
            pool.run(fail_on_rank_zero, output=CollectingSink())
        pool.debug(output=CollectingSink())
        assert scripted.prompts[2].startswith("nbaccel: rank 0 raised LookupError: rank zero's; post-mortem")
        assert scripted.prompts[3].startswith('"rank zero\'s"\n')
        assert pool.run(lambda: "kept", output=CollectingSink()) == ["kept", "kept"]
