"""Reading the launch environment and checking it against the process group (pure, no processes).

Imports internals (state.default_group, state.launch_env): it tests those units directly, below the public face.
"""

from __future__ import annotations

import pytest

from nbaccel.state.default_group import GroupInfo, check_agreement, default_backend, join_default_group
from nbaccel.state.launch_env import LaunchEnvironment, fork_launched, is_truthy, normalize_mixed_precision


def test_nothing_launched_reads_as_one_process():
    env = LaunchEnvironment.read({})
    assert (env.world_size, env.rank, env.local_rank, env.local_world_size) == (None, None, None, None)
    assert not env.is_distributed and env.local_index(0) == 0
    assert (env.device_type, env.use_cpu, env.mixed_precision, env.debug) == (None, False, "no", False)


def test_a_launchers_variables_are_read():
    env = LaunchEnvironment.read(
        {
            "WORLD_SIZE": "8",
            "RANK": "5",
            "LOCAL_RANK": "1",
            "LOCAL_WORLD_SIZE": "4",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29511",
            "NBACCEL_DEVICE_TYPE": "cpu",
            "ACCELERATE_USE_CPU": "true",
            "ACCELERATE_MIXED_PRECISION": "fp16",
        }
    )
    assert (env.world_size, env.rank, env.local_rank, env.local_world_size) == (8, 5, 1, 4)
    assert env.is_distributed and env.local_index(5) == 1
    assert (env.master_addr, env.master_port, env.device_type, env.use_cpu, env.mixed_precision) == (
        "127.0.0.1",
        "29511",
        "cpu",
        True,
        "fp16",
    )


def test_local_index_without_local_rank():
    assert LaunchEnvironment(local_world_size=4).local_index(6) == 2  # two machines of four
    assert LaunchEnvironment().local_index(3) == 3  # one machine assumed


def test_world_size_without_rank_is_left_to_the_group():
    # Accelerate's debug_launcher sets WORLD_SIZE but creates the group with rank= itself.
    assert LaunchEnvironment.read({"WORLD_SIZE": "2"}).rank is None


@pytest.mark.parametrize("value", ["1", "true", "TRUE", "yes", "on", " True "])
def test_truthy_flags(value):
    assert is_truthy(value)


@pytest.mark.parametrize("value", [None, "", "0", "false", "no", "2"])
def test_falsy_flags(value):
    assert not is_truthy(value)


def test_fork_launched_reads_either_marker():
    assert fork_launched({"NBACCEL_FORK_LAUNCHED": "1"}) and fork_launched({"FORK_LAUNCHED": "1"})
    assert not fork_launched({}) and not fork_launched({"FORK_LAUNCHED": "0"})


def test_mixed_precision_is_normalised_or_refused():
    assert normalize_mixed_precision(" BF16 ", "x") == "bf16"
    with pytest.raises(ValueError, match=r"x='int8' is not a mixed-precision mode"):
        normalize_mixed_precision("int8", "x")


def test_group_agreeing_with_the_environment_passes():
    check_agreement(LaunchEnvironment(world_size=4, rank=2), GroupInfo(4, 2, "gloo"))
    check_agreement(LaunchEnvironment(), GroupInfo(4, 2, "gloo"))  # nothing stated: nothing to contradict
    check_agreement(LaunchEnvironment(world_size=4), GroupInfo(4, 2, "gloo"))


@pytest.mark.parametrize(
    ("env", "group"),
    [
        (LaunchEnvironment(world_size=4, rank=2), GroupInfo(4, 1, "gloo")),
        (LaunchEnvironment(world_size=4, rank=2), GroupInfo(2, 0, "gloo")),
        (LaunchEnvironment(world_size=1), GroupInfo(2, 0, "gloo")),
        (LaunchEnvironment(rank=0), GroupInfo(2, 1, "gloo")),
    ],
)
def test_group_disagreeing_with_the_environment_is_an_error(env, group):
    with pytest.raises(ValueError, match=f"world size {group.world_size} and rank {group.rank}, but the environment says"):
        check_agreement(env, group)


def test_backend_follows_the_device():
    assert default_backend("cpu") == "gloo" and default_backend("cuda") == "nccl"


def test_one_process_joins_no_group():
    assert join_default_group(LaunchEnvironment(world_size=1, rank=0), "gloo", {}) is None
