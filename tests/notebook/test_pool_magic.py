"""%distributed and %%distributed's routing, in a real IPython shell with a stand-in worker pool.

The stand-in (tests/notebook/stand_ins.FakePool) runs each task in-process, once per rank, after
a cloudpickle round trip (as the real pool sends it), so names persist per rank as on real workers.

Imports internals (notebook, notebook.magics): it tests those units directly, below the public face.
"""

from __future__ import annotations

from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell

from nbaccel.notebook import pool_commands as worker_commands
from tests.notebook.conftest import magics_of
from tests.notebook.stand_ins import FakePool, Launches, Starts

pytestmark = pytest.mark.timeout(30)


def notices(capsys: pytest.CaptureFixture[str]) -> list[str]:
    """nbaccel's notices printed since the last call (on stdout, where every notice goes)."""
    captured = capsys.readouterr()
    assert "nbaccel:" not in captured.err
    return [line for line in captured.out.splitlines() if line.startswith("nbaccel:")]


def cell(ip: InteractiveShell, code: str) -> Any:
    result = ip.run_cell(code, store_history=True)
    if result.error_in_exec is not None:
        raise result.error_in_exec
    if result.error_before_exec is not None:
        raise result.error_before_exec
    return result.result


# -- %distributed: parsing ------------------------------------------------------------------------


def test_commands_and_options_are_parsed() -> None:
    args = worker_commands.parse("start -n 4 --gpus 0,1,2,3 --mixed-precision bf16 --start-method spawn --cpu")
    assert (args.command, args.num_processes, args.gpus, args.mixed_precision, args.start_method, args.cpu) == ("start", 4, (0, 1, 2, 3), "bf16", "spawn", True)
    assert worker_commands.parse("push a b").names == ["a", "b"]
    pull = worker_commands.parse("pull w --rank 1 -o weights")
    assert (pull.name, pull.rank, pull.out) == ("w", 1, "weights")
    assert worker_commands.parse("pull w").rank == 0


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("", "%distributed needs a command: start, stop, restart, status, free, stacks, debug, push, pull"),
        ("launch", "invalid choice: 'launch'"),
        ("start -n 0", "expected a whole number >= 1, got '0'"),
        ("start --gpus a,b", "expected device indices"),
        ("start --mixed-precision fp3", "invalid choice: 'fp3'"),
        ("start --gpus 0 --cpu", "%distributed start: gpus and cpu=True contradict each other"),
        ("stop now", "unrecognized arguments: now"),
        ("push", "required: NAME"),
        ("push 1x", "expected a Python variable name, got '1x'"),
        ("pull x --rank -1", "expected a whole number >= 0, got '-1'"),
        ("pull 'x", "No closing quotation"),
    ],
)
def test_wrong_input_is_a_one_line_usage_error(ip: InteractiveShell, started: Starts, line: str, words: str) -> None:
    with pytest.raises(UsageError) as caught:
        ip.run_line_magic("distributed", line)
    assert words in str(caught.value) and "\n" not in str(caught.value)
    assert started == []


def test_help_explains_every_command_and_option(ip: InteractiveShell, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_cell("%distributed?")
    text = capsys.readouterr().out
    for words in (
        "start",
        "stop",
        "restart",
        "status",
        "push",
        "pull",
        "--num-processes N",
        "--gpus",
        "--mixed-precision",
        "--start-method",
        "--rank R",
        "--out TARGET",
    ):
        assert words in text, words


def test_both_magics_are_registered(ip: InteractiveShell) -> None:
    assert ip.find_cell_magic("distributed") is not None and ip.find_line_magic("distributed") is not None


# -- %distributed: commands -----------------------------------------------------------------------


def test_start_passes_the_options_and_the_notebooks_namespace(ip: InteractiveShell, started: Starts, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("distributed", "start -n 3 --mixed-precision bf16 --cpu")
    assert started[0].num_processes == 3
    assert started[0].options == {"cpu": True, "mixed_precision": "bf16", "namespace": ip.user_ns}
    assert "nbaccel: 3 workers ready on cpu in" in capsys.readouterr().out


def test_start_while_workers_run_says_to_stop_or_restart_first(ip: InteractiveShell, pool: FakePool) -> None:
    with pytest.raises(UsageError, match=r"2 workers are already running: %distributed stop first \(or %distributed restart"):
        ip.run_line_magic("distributed", "start")


def test_spawned_workers_say_their_namespaces_start_empty(ip: InteractiveShell, started: Starts, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("distributed", "start --start-method spawn")
    assert "workers started by spawn begin with empty namespaces: %distributed push what the cells need" in capsys.readouterr().out


def test_what_start_refuses_before_forking_is_a_usage_error(ip: InteractiveShell, started: Starts) -> None:
    started.raises = ValueError("num_processes=4 but only 2 GPU(s) are visible")
    with pytest.raises(UsageError, match=r"^%distributed start: num_processes=4 but only 2 GPU\(s\) are visible$"):
        ip.run_line_magic("distributed", "start -n 4")


def test_stop_restart_and_status(ip: InteractiveShell, pool: FakePool, capsys: pytest.CaptureFixture[str]) -> None:
    cell(ip, "%%distributed\nkept = 1")
    ip.run_line_magic("distributed", "status")
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["rank", "pid", "device", "state", "cpu", "memory", "peak", "last", "cell"]
    assert table[1].split() == ["0", "1000", "cpu", "idle", "-", "100", "MiB", "-", "kept", "=", "1"]
    ip.run_line_magic("distributed", "restart")
    assert pool.restarted == 1 and "fresh namespaces" in capsys.readouterr().out
    ip.run_line_magic("distributed", "stop")
    assert not pool.alive and "2 workers stopped" in capsys.readouterr().out
    ip.run_line_magic("distributed", "status")
    assert capsys.readouterr().out == "nbaccel: no workers running: start them with %distributed start [-n N]\n"
    with pytest.raises(UsageError, match="no workers to restart"):
        ip.run_line_magic("distributed", "restart")


@pytest.mark.parametrize("line", ["push x", "pull x"])
def test_push_and_pull_need_running_workers(ip: InteractiveShell, started: Starts, line: str) -> None:
    ip.user_ns["x"] = 1
    with pytest.raises(UsageError, match=r"^no workers running: start them with %distributed start \[-n N\]\.$"):
        ip.run_line_magic("distributed", line)


def test_push_sends_notebook_variables_to_every_rank(ip: InteractiveShell, pool: FakePool) -> None:
    ip.user_ns.update(a=1, b=[2])
    ip.run_line_magic("distributed", "push a b")
    assert all(ns["a"] == 1 and ns["b"] == [2] for ns in pool.namespaces)
    with pytest.raises(UsageError, match="'undefined_name' is not defined in the notebook"):
        ip.run_line_magic("distributed", "push a undefined_name")


def test_push_of_an_unpicklable_object_names_it(ip: InteractiveShell, pool: FakePool, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(**values: Any) -> None:
        raise TypeError("cannot push 'lock': a lock cannot be pickled")

    monkeypatch.setattr(pool, "push", refuse)
    ip.user_ns["lock"] = object()
    with pytest.raises(UsageError, match="^%distributed push: cannot push 'lock': a lock cannot be pickled$"):
        ip.run_line_magic("distributed", "push lock")


def test_pull_stores_a_ranks_variable_in_the_notebook(ip: InteractiveShell, pool: FakePool) -> None:
    pool.namespaces[1]["w"] = "rank 1's w"
    ip.run_line_magic("distributed", "pull w --rank 1 -o got")
    assert ip.user_ns["got"] == "rank 1's w"
    pool.namespaces[0]["w"] = "rank 0's w"
    ip.run_line_magic("distributed", "pull w")
    assert ip.user_ns["w"] == "rank 0's w"
    with pytest.raises(UsageError, match=r"--rank 2 is outside the 2 workers \(ranks 0\.\.1\)"):
        ip.run_line_magic("distributed", "pull w --rank 2")


def test_unloading_the_extension_stops_the_workers(ip: InteractiveShell, pool: FakePool, capsys: pytest.CaptureFixture[str]) -> None:
    ip.run_line_magic("unload_ext", "nbaccel")
    ip.run_line_magic("load_ext", "nbaccel")
    assert not pool.alive
    assert "nbaccel: stopped the 2 workers of the unloaded extension\n" in capsys.readouterr().out


# -- %%distributed: routing -----------------------------------------------------------------------


def test_with_workers_cells_run_on_them_and_names_persist_per_rank(ip: InteractiveShell, pool: FakePool, launches: Launches) -> None:
    assert cell(ip, "%%distributed\nimport os\nmine = int(os.environ['RANK']) * 10\nmine + 1") == 1
    assert cell(ip, "%%distributed -o everyone\nmine + 2") == 2
    assert ip.user_ns["everyone"] == [2, 12]
    assert "mine" not in ip.user_ns and launches == []
    assert pool.calls[0] == {"ranks": None, "timeout": None, "output": None, "label": "import os"}


def test_only_rank_0s_value_travels_unless_out_asks_for_all(ip: InteractiveShell, pool: FakePool) -> None:
    assert cell(ip, "%%distributed\nimport os\nsent = os.environ['RANK']\nsent") == "0"
    assert [ns["sent"] for ns in pool.namespaces] == ["0", "1"]
    assert pool.last_answers == {0: "0", 1: None}  # rank 1's value stayed on rank 1
    cell(ip, "%%distributed -o everyone\nsent")
    assert pool.last_answers == {0: "0", 1: "1"}


def test_ranks_runs_on_some_ranks_result_is_the_lowest_and_out_a_dict(ip: InteractiveShell, started: Starts) -> None:
    ip.run_line_magic("distributed", "start -n 4")
    pool = started[0]
    assert cell(ip, "%%distributed --ranks 3,1 -o by_rank\nimport os\nran = True\nint(os.environ['RANK']) * 100") == 100
    assert ip.user_ns["by_rank"] == {1: 100, 3: 300}
    assert ["ran" in ns for ns in pool.namespaces] == [False, True, False, True]
    assert pool.calls[-1]["ranks"] == (1, 3)


def test_timeout_and_output_options_reach_the_workers(ip: InteractiveShell, pool: FakePool) -> None:
    cell(ip, "%%distributed --timeout 2.5 --text\n1")
    assert pool.calls[-1]["timeout"] == 2.5 and pool.calls[-1]["output"] == "text"


@pytest.mark.parametrize("line", ["-n 2", "--gpus 0", "--cpu", "--mixed-precision bf16", "--start-method fork", "--max-restarts 1"])
def test_one_shot_options_with_workers_running_are_a_usage_error(ip: InteractiveShell, pool: FakePool, line: str) -> None:
    spelled = line.split()[0]
    with pytest.raises(UsageError, match=rf"^{spelled} only apply to one-shot launches, but 2 workers are running"):
        cell(ip, f"%%distributed {line}\n1")
    assert pool.calls == []


def test_ranks_outside_the_workers_are_a_usage_error(ip: InteractiveShell, pool: FakePool) -> None:
    with pytest.raises(UsageError, match=r"^--ranks 1,2: rank\(s\) 2 are outside the 2 running workers \(ranks 0\.\.1\)\.$"):
        cell(ip, "%%distributed --ranks 1,2\n1")


def test_ranks_without_workers_is_a_usage_error_and_nothing_starts(ip: InteractiveShell, started: Starts, launches: Launches) -> None:
    with pytest.raises(UsageError, match=r"^--ranks 0 needs running workers, and none are running: start them with %distributed start -n N"):
        cell(ip, "%%distributed --ranks 0\n1")
    assert launches == []


def test_a_one_shot_launch_says_so_once_and_again_after_workers_stop(
    ip: InteractiveShell, started: Starts, launches: Launches, capsys: pytest.CaptureFixture[str]
) -> None:
    magics_of(ip).workers.mode = None  # a fresh session
    cell(ip, "%%distributed -n 2\n1")
    assert notices(capsys) == ["nbaccel: no workers running; one-shot launch of 2 ranks"]
    cell(ip, "%%distributed\n1")
    assert notices(capsys) == []  # no news, no line
    ip.run_line_magic("distributed", "start")
    cell(ip, "%%distributed\n1")
    started[0].alive = False  # torn down after a failure
    cell(ip, "%%distributed\n1")
    assert notices(capsys)[-1] == "nbaccel: no workers running (stopped after a failure); one-shot launch"
    assert len(launches) == 3


def test_a_syntax_error_on_workers_is_raised_in_the_kernel_and_nothing_runs(ip: InteractiveShell, pool: FakePool) -> None:
    from nbaccel.notebook.magics import CellSyntaxError

    with pytest.raises(CellSyntaxError, match=r"line 3 of the cell"):
        cell(ip, "%%distributed\nok = 1\nx = (\n")
    assert pool.calls == []


def test_nbaccel_quiet_silences_the_notices_not_the_answers(
    ip: InteractiveShell, started: Starts, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NBACCEL_QUIET", "1")
    magics_of(ip).workers.mode = None
    cell(ip, "%%distributed -n 2\n1")  # would say "one-shot launch"
    ip.run_line_magic("distributed", "start -n 2")  # would say "2 workers ready"
    ip.run_line_magic("distributed", "stop")
    assert notices(capsys) == []
    ip.run_line_magic("distributed", "status")
    assert notices(capsys) == ["nbaccel: no workers running: start them with %distributed start [-n N]"]  # asked for


def test_restart_wait_for_is_for_a_pool_across_nodes(ip: InteractiveShell, pool: FakePool) -> None:
    with pytest.raises(UsageError, match=r"^%distributed restart --wait-for 2: these workers run on this machine only; --wait-for is for a pool across nodes"):
        ip.run_line_magic("distributed", "restart --wait-for 2")
    assert pool.restarted == 0 and pool.alive


def test_cluster_refuses_what_cannot_work_in_one_line(ip: InteractiveShell) -> None:
    with pytest.raises(UsageError, match=r"^%distributed cluster 0.0.0.0: Cluster\('0.0.0.0':0\) would listen on every interface"):
        ip.run_line_magic("distributed", "cluster 0.0.0.0 --via ssh --hosts node1")
    with pytest.raises(UsageError, match=r"^%distributed cluster: via='ssh' starts one agent per host: give hosts="):
        ip.run_line_magic("distributed", "cluster 127.0.0.1 --via ssh --token-dir /tmp")
    assert "cluster" not in ip.user_ns


def test_status_is_an_html_table_and_its_watch_is_read_again_after_every_cell(ip: InteractiveShell, pool: FakePool, monkeypatch: pytest.MonkeyPatch) -> None:
    published: list[tuple[dict[str, Any], dict[str, Any], bool]] = []

    def publish(data: dict[str, Any], metadata: Any = None, *args: Any, transient: Any = None, update: bool = False, **kwargs: Any) -> None:
        published.append((data, transient or {}, update))

    monkeypatch.setattr(ip.display_pub, "publish", publish)
    ip.run_line_magic("distributed", "status")
    ((data, _, _),) = published
    assert "<table class='nbaccel-status'>" in data["text/html"] and "<td>idle</td>" in data["text/html"]  # VS Code, Colab, GitHub
    assert data["text/plain"].splitlines()[0].split()[:4] == ["rank", "pid", "device", "state"]  # terminal IPython, papermill
    published.clear()
    cell(ip, "%distributed status --watch")
    shown, display_id = published[0][0], published[0][1]["display_id"]
    assert "watched: read again after every cell" in shown["text/plain"]
    cell(ip, "%%distributed\nwatched = 1")
    updates = [(d, t) for d, t, update in published if update]
    assert updates and updates[-1][1]["display_id"] == display_id and "watched = 1" in updates[-1][0]["text/html"]
    ip.run_line_magic("distributed", "stop")
    cell(ip, "1 + 1")  # the next cell's end: the watched table says the workers stopped, and the watch ends
    assert "no workers running" in [d for d, t, update in published if update][-1]["text/plain"]
    count = len(published)
    cell(ip, "2 + 2")
    assert len(published) == count  # no more updates


def test_restart_wait_for_a_node_range_reaches_a_pool_across_nodes(ip: InteractiveShell, pool: FakePool) -> None:
    seen: dict[str, object] = {}
    pool.cluster = object()  # type: ignore[attr-defined]  # what marks a pool across nodes
    pool.restart = lambda wait_for=None, settle=0.0: seen.update(wait_for=wait_for, settle=settle)  # type: ignore[method-assign, assignment]
    ip.run_line_magic("distributed", "restart --wait-for 2:4 --settle 5")
    assert seen == {"wait_for": "2:4", "settle": 5.0}
    with pytest.raises(UsageError, match="MIN:MAX with 1 <= MIN <= MAX, got '4:2'"):
        ip.run_line_magic("distributed", "restart --wait-for 4:2")


def test_cluster_via_ray_without_a_ray_cluster_leaves_nothing(ip: InteractiveShell, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # Ray not installed here
    with pytest.raises(
        UsageError, match=r'^%distributed cluster: via="ray" needs Ray in the kernel\'s environment, which has none: pip install "nbaccel\[ray\]"'
    ):
        ip.run_line_magic("distributed", "cluster 127.0.0.1 --via ray --nodes 2 --cpus-per-node 1 --strategy PACK")
    assert "cluster" not in ip.user_ns
    with pytest.raises(UsageError, match=r"^%distributed cluster: strategy='NOWHERE': one of STRICT_SPREAD"):
        ip.run_line_magic("distributed", "cluster 127.0.0.1 --via ray --nodes 2 --strategy NOWHERE")
