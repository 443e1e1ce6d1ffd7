"""One process, no launch: the state behaves as the seed says, with the same validation as on many.

Imports internals (state, state.default_group): it tests those units directly, below the public face.
"""

from __future__ import annotations

import contextlib
import io
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from nbaccel import (
    AcceleratorState,
    DistributedType,
    GradientAccumulationPlugin,
    GradientState,
    InitProcessGroupKwargs,
    NbaccelError,
    PartialState,
)
from nbaccel.state import StateResetError, reset_all_states


def printed(function, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        value = function(*args)
    return out.getvalue(), value


# -- PartialState -------------------------------------------------------------------------------


def test_single_process_attributes():
    state = PartialState()
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.distributed_type is DistributedType.NO
    assert state.backend is None
    expected = "cuda" if torch.cuda.device_count() > 0 else "cpu"
    assert state.device.type == expected
    assert state.is_main_process and state.is_local_main_process and state.is_last_process
    assert not state.use_distributed and state.initialized
    assert state.mixed_precision == "no" and state.debug is False and state.fork_launched is False
    assert not dist.is_initialized(), "one process must not create a process group"


def test_instances_share_one_state():
    first, second = PartialState(), PartialState()
    assert first is not second
    assert first._state is second._state
    PartialState._reset_state()
    assert not first.initialized
    third = PartialState()
    assert first.initialized and first._state is third._state


def test_use_after_reset_is_an_attribute_error_that_says_what_to_do():
    state = PartialState()
    PartialState._reset_state()
    with pytest.raises(AttributeError, match=r"_reset_state\(\).*state = PartialState\(\)"):
        _ = state.process_index
    with pytest.raises(StateResetError):
        _ = state.device


def test_world_size_one_from_a_launcher_is_a_single_process(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    state = PartialState()
    assert state.distributed_type is DistributedType.NO and state.num_processes == 1
    assert not dist.is_initialized()


def test_cpu_flag_and_environment_force_the_cpu(monkeypatch):
    assert PartialState(cpu=True).device == torch.device("cpu")
    reset_all_states()
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert PartialState().device == torch.device("cpu")
    reset_all_states()
    monkeypatch.setenv("NBACCEL_DEVICE_TYPE", "cpu")
    assert PartialState().device == torch.device("cpu")


def test_environment_flags(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DEBUG_MODE", "1")  # Accelerate ignores "1"; nbaccel does not
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "BF16")
    monkeypatch.setenv("NBACCEL_FORK_LAUNCHED", "1")
    state = PartialState()
    assert state.debug is True and state.mixed_precision == "bf16" and state.fork_launched is True
    monkeypatch.delenv("NBACCEL_FORK_LAUNCHED")
    assert state.fork_launched is False
    monkeypatch.setenv("FORK_LAUNCHED", "1")  # Accelerate's marker counts too
    assert state.fork_launched is True


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"WORLD_SIZE": "four"}, r"WORLD_SIZE='four' in the environment is not an integer"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE='0'.*>= 1"),
        ({"WORLD_SIZE": "2"}, r"WORLD_SIZE=2 .* RANK is not set"),
        ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK=2 is not below WORLD_SIZE=2"),
        ({"LOCAL_RANK": "-1"}, r"LOCAL_RANK='-1'"),
        ({"NBACCEL_DEVICE_TYPE": "tpu"}, r"NBACCEL_DEVICE_TYPE='tpu' is not a device type"),
        ({"ACCELERATE_MIXED_PRECISION": "fp4"}, r"ACCELERATE_MIXED_PRECISION='fp4' is not a mixed-precision"),
        ({"WORLD_SIZE": "2", "RANK": "0"}, r"MASTER_ADDR=None and MASTER_PORT=None do not say where"),
    ],
)
def test_malformed_launch_variables_are_named_with_their_value(monkeypatch, variables, message):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=message):
        PartialState()
    assert PartialState._shared is None  # the failed set-up left nothing shared


def test_kwargs_are_validated_even_for_one_process():
    with pytest.raises(TypeError, match=r"'timeot' is not .*init_process_group.*Accepted: .*timeout"):
        PartialState(timeot=timedelta(seconds=5))


def test_init_process_group_kwargs_pass_through_and_must_not_change_later():
    kwargs = InitProcessGroupKwargs(timeout=timedelta(seconds=30)).to_kwargs()
    assert kwargs == {"timeout": timedelta(seconds=30)}
    PartialState(**kwargs)
    PartialState(**kwargs)  # the same again is fine
    PartialState()  # and so is nothing
    with pytest.raises(ValueError, match=r"already set up with init_process_group arguments"):
        PartialState(timeout=timedelta(seconds=60))


def test_init_process_group_kwargs_validates_its_fields():
    with pytest.raises(TypeError, match=r"timeout must be a datetime.timedelta, got 60"):
        InitProcessGroupKwargs(timeout=60)
    assert InitProcessGroupKwargs().to_kwargs() == {}


def test_cpu_must_be_a_bool():
    with pytest.raises(TypeError, match="cpu must be True or False, got 'yes'"):
        PartialState(cpu="yes")


def test_repr_lists_the_topology():
    assert repr(PartialState()).startswith("Distributed environment: NO  Backend: None\nNum processes: 1\n")


# -- the decorators and context managers on one process ---------------------------------------------


def test_every_index_zero_decorator_runs_and_returns_its_value():
    state = PartialState()
    decorated = [
        state.on_main_process(lambda: "main"),
        state.on_main_process()(lambda: "main()"),
        state.on_local_main_process(lambda: "local"),
        state.on_local_main_process()(lambda: "local()"),
        state.on_last_process(lambda: "last"),
        state.on_last_process()(lambda: "last()"),
        state.on_process(process_index=0)(lambda: "p0"),
        state.on_process(lambda: "p0 direct", process_index=0),
        state.on_local_process(local_process_index=0)(lambda: "lp0"),
        state.on_local_process(local_process_idx=0)(lambda: "lp0 idx"),
    ]
    assert [f() for f in decorated] == [
        "main",
        "main()",
        "local",
        "local()",
        "last",
        "last()",
        "p0",
        "p0 direct",
        "lp0",
        "lp0 idx",
    ]


def test_other_indices_do_not_run_on_one_process():
    state = PartialState()
    calls = []
    assert state.on_process(process_index=2)(lambda: calls.append(2))() is None
    assert state.on_local_process(local_process_index=1)(lambda: calls.append(1))() is None
    assert calls == []


def test_decorators_keep_the_name_docstring_and_arguments():
    state = PartialState()

    @state.on_main_process
    def add(a, b=1):
        """Adds."""
        return a + b

    assert add(2, b=3) == 5 and add.__name__ == "add" and add.__doc__ == "Adds." and add.__wrapped__


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda s: s.on_process(lambda: 0), TypeError, r"on_process needs the index.*process_index=0"),
        (lambda s: s.on_process(2), TypeError, r"got 2 where the function.*on_process\(process_index=2\)"),
        (lambda s: s.on_process(process_index=-1), ValueError, r"process_index must be an int >= 0, got -1"),
        (lambda s: s.on_process(process_index="0"), ValueError, r"got '0'"),
        (lambda s: s.on_process(process_index=True), ValueError, r"got True"),
        (lambda s: s.on_local_process(lambda: 0), TypeError, r"on_local_process needs the index"),
        (lambda s: s.on_local_process(local_process_index=0, local_process_idx=1), TypeError, r"pass one"),
        (lambda s: s.on_main_process("x"), TypeError, r"on_main_process decorates a function, got 'x'"),
        (lambda s: s.on_last_process()(3), TypeError, r"on_last_process decorates a function, got 3"),
    ],
)
def test_decorator_misuse_is_a_clear_error(make, error, message):
    with pytest.raises(error, match=message):
        make(PartialState())


def test_decorators_decide_when_called_not_when_decorated():
    state = PartialState()
    hello = state.on_main_process(lambda: "hi")
    reset_all_states()
    with pytest.raises(StateResetError):
        hello()
    PartialState()
    assert hello() == "hi"


def test_wait_for_everyone_and_first_blocks_need_no_process_group():
    state = PartialState()
    state.wait_for_everyone()
    with state.main_process_first():
        pass
    with state.local_main_process_first():
        pass
    assert not dist.is_initialized()


def test_an_exception_in_a_first_block_propagates_unchanged():
    state = PartialState()
    with pytest.raises(KeyError, match="boom"), state.main_process_first():
        raise KeyError("boom")


def test_print_prints_on_the_local_main_process():
    out, _ = printed(lambda: PartialState().print("Accelerate is the best", end="!\n"))
    assert out == "Accelerate is the best!\n"


def test_split_between_processes_yields_the_whole_input():
    state = PartialState()
    with state.split_between_processes(["A", "B", "C"], apply_padding=True) as inputs:
        assert inputs == ["A", "B", "C"]
    with pytest.raises(TypeError, match="cannot split"), state.split_between_processes("ABC"):
        pass


def test_set_device_and_destroy_without_a_group_are_harmless():
    state = PartialState()
    state.set_device()
    state.destroy_process_group()
    assert not dist.is_initialized()


def test_distributed_type_compares_like_accelerates():
    accelerate_state = pytest.importorskip("accelerate.utils")
    assert DistributedType.MULTI_CPU == accelerate_state.DistributedType.MULTI_CPU
    assert DistributedType.NO == "NO"


# -- AcceleratorState ------------------------------------------------------------------------------


def test_accelerator_state_adds_configuration_to_the_process_state():
    plugins = {name: object() for name in ("dynamo_plugin", "fsdp_plugin", "torch_tp_plugin", "megatron_lm_plugin", "parallelism_config")}
    state = AcceleratorState(mixed_precision="fp16", **plugins)
    assert state.initialized and state.mixed_precision == "fp16" and state.num_processes == 1
    for name, plugin in plugins.items():
        assert getattr(state, name) is plugin
    assert state.deepspeed_plugin is None and state.deepspeed_plugins == {}
    assert isinstance(state, PartialState) and state.is_main_process
    assert repr(state).endswith("Mixed precision type: fp16\n")
    assert AcceleratorState().fsdp_plugin is plugins["fsdp_plugin"]  # a later instance shares it


def test_accelerator_state_reads_the_launchers_precision(monkeypatch):
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert AcceleratorState().mixed_precision == "bf16"
    reset_all_states()
    assert AcceleratorState(mixed_precision="no").mixed_precision == "no"  # the argument wins


@pytest.mark.parametrize("value", ["fp32", "half", 16, None.__class__])
def test_unknown_mixed_precision_is_rejected(value):
    with pytest.raises(ValueError, match=r"is not a mixed-precision mode.*'no', 'fp16', 'bf16', 'fp8'"):
        AcceleratorState(mixed_precision=value)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="checks the CPU-only error")
def test_fp8_without_a_capable_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match=r"fp8.*compute capability 8.9.*runs on the CPU.*'bf16'"):
        AcceleratorState(mixed_precision="fp8", cpu=True)
    assert not AcceleratorState._config


def test_accelerator_state_configuration_cannot_change():
    plugin = object()
    AcceleratorState(mixed_precision="bf16", fsdp_plugin=plugin)
    AcceleratorState(mixed_precision="bf16", fsdp_plugin=plugin)
    AcceleratorState()
    with pytest.raises(ValueError, match=r"cannot change: mixed_precision='fp16' \(set up with 'bf16'\)"):
        AcceleratorState(mixed_precision="fp16")
    with pytest.raises(ValueError, match=r"fsdp_plugin="):
        AcceleratorState(fsdp_plugin=object())


def test_accelerator_state_reset_keeps_or_drops_the_process_state():
    AcceleratorState(mixed_precision="bf16")
    AcceleratorState._reset_state()
    assert PartialState().initialized and AcceleratorState(mixed_precision="fp16").mixed_precision == "fp16"
    AcceleratorState._reset_state(reset_partial_state=True)
    assert PartialState._shared is None and AcceleratorState._config is None


def test_accelerator_state_accepts_accelerates_private_flag():
    assert AcceleratorState(_from_accelerator=True).initialized


def test_one_deepspeed_plugin_is_the_selected_default():
    state = AcceleratorState(deepspeed_plugin="zero3")
    assert state.deepspeed_plugin == "zero3"
    assert state.deepspeed_plugins == {"default": "zero3"}
    assert state.get_deepspeed_plugin("default") == "zero3"
    state.select_deepspeed_plugin()
    assert state.deepspeed_plugin == "zero3"


def test_named_deepspeed_plugins_can_be_looked_up_and_selected():
    state = AcceleratorState(deepspeed_plugin={"student": "zero2", "teacher": "zero3"})
    assert state.deepspeed_plugin == "zero2"  # the first is selected
    assert state.get_deepspeed_plugin("teacher") == "zero3"
    state.select_deepspeed_plugin("teacher")
    assert state.deepspeed_plugin == "zero3" and AcceleratorState().deepspeed_plugin == "zero3"
    with pytest.raises(KeyError, match=r"no DeepSpeed plugin called 'tutor'; the plugins are \['student', 'teacher'\]"):
        state.get_deepspeed_plugin("tutor")
    with pytest.raises(KeyError, match="'tutor'"):
        state.select_deepspeed_plugin("tutor")
    with pytest.raises(ValueError, match="needs a name"):
        state.select_deepspeed_plugin()


@pytest.mark.parametrize(("plugin", "error"), [({}, ValueError), ({1: "x"}, TypeError), ({"": "x"}, TypeError)])
def test_bad_deepspeed_plugin_dicts_are_rejected(plugin, error):
    with pytest.raises(error):
        AcceleratorState(deepspeed_plugin=plugin)


def test_no_deepspeed_plugin_lookup_says_none_was_given():
    with pytest.raises(KeyError, match="was given no deepspeed_plugin"):
        AcceleratorState().get_deepspeed_plugin("default")


# -- GradientState ---------------------------------------------------------------------------------


def test_gradient_state_defaults():
    state = GradientState()
    assert (state.num_steps, state.adjust_scheduler, state.sync_with_dataloader) == (1, True, True)
    assert state.sync_gradients is True and state.end_of_dataloader is False and state.remainder == -1
    assert state.active_dataloader is None and state.dataloader_references == [None]
    assert state.in_dataloader is False and state.is_xla_gradients_synced is False and state.initialized
    assert state.plugin_kwargs == {"num_steps": 1, "adjust_scheduler": True, "sync_with_dataloader": True}


def test_a_later_plugin_updates_the_shared_gradient_state():
    first = GradientState(GradientAccumulationPlugin(num_steps=2))
    GradientState()  # no plugin: nothing changes
    assert first.num_steps == 2
    GradientState(GradientAccumulationPlugin(num_steps=4, adjust_scheduler=False, sync_with_dataloader=False))
    assert (first.num_steps, first.adjust_scheduler, first.sync_with_dataloader) == (4, False, False)


def test_gradient_state_validation():
    with pytest.raises(ValueError, match=r"num_steps=0.*>= 1"):
        GradientAccumulationPlugin(num_steps=0)
    with pytest.raises(TypeError, match="adjust_scheduler must be True or False"):
        GradientAccumulationPlugin(adjust_scheduler=1)
    with pytest.raises(TypeError, match=r"takes a GradientAccumulationPlugin, got \{'num_steps': 2\}"):
        GradientState({"num_steps": 2})


def test_is_xla_gradients_synced_is_settable_and_reset():
    state = GradientState()
    state.is_xla_gradients_synced = True
    assert GradientState().is_xla_gradients_synced is True
    GradientState._reset_state()
    assert GradientState().is_xla_gradients_synced is False


def test_reset_all_states_resets_the_three_states():
    PartialState()
    AcceleratorState(mixed_precision="bf16")
    GradientState(GradientAccumulationPlugin(num_steps=3))
    reset_all_states()
    assert PartialState._shared is None and AcceleratorState._config is None and GradientState._shared is None


def test_errors_are_nbaccel_errors():
    assert issubclass(StateResetError, NbaccelError) and issubclass(StateResetError, AttributeError)


def test_device_id_binds_an_nccl_group_to_the_rank_gpu():
    from nbaccel.state.default_group import _with_device_id

    cuda1 = torch.device("cuda", 1)
    assert _with_device_id("nccl", {"timeout": 5}, cuda1) == {"timeout": 5, "device_id": cuda1}
    assert _with_device_id("gloo", {"backend": "cuda:nccl,cpu:gloo"}, cuda1)["device_id"] == cuda1
    assert _with_device_id("nccl", {"device_id": torch.device("cuda", 0)}, cuda1)["device_id"].index == 0
    assert "device_id" not in _with_device_id("gloo", {}, torch.device("cpu"))
    assert "device_id" not in _with_device_id("nccl", {}, None)
