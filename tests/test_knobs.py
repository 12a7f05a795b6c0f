"""The knob table: conditions make invalid and duplicate configurations impossible."""

from __future__ import annotations

import pytest

from autocompile.config.knobs import KNOBS, Env, KnobError, TrialConfig, describe
from autocompile.trial.program.step import compile_kwargs


def cfg(env: Env, **values: object) -> TrialConfig:
    return TrialConfig.from_flat({k.replace("__", "."): v for k, v in values.items()}, env)


def test_every_knob_has_doc_values_and_a_dotted_key() -> None:
    assert {"compile.scope", "compile.granularity", "compile.optimizer", "compile.backend", "compile.mode",
            "compile.dynamic", "compile.fullgraph", "compile.compiled_autograd", "amp.dtype", "amp.placement",
            "placement.order", "ddp.wrap_order", "ddp.optimize", "ac.policy",
            "compile.options.coordinate_descent_tuning"} <= set(KNOBS)
    for key, (spec, _default) in KNOBS.items():
        assert spec.doc and "." in key


def test_defaults_round_trip_through_flat(cpu_env: Env) -> None:
    config = TrialConfig.from_flat({}, cpu_env)
    assert config.compile.scope == "module" and config.amp.dtype == "none"
    assert TrialConfig.from_flat(config.flat(), cpu_env) == config


@pytest.mark.parametrize(("values", "needs"), [
    ({"ddp.wrap_order": "compile_of_ddp"}, "world size > 1"),
    ({"ddp.optimize": "no_optimization"}, "world size > 1"),
    ({"amp.placement": "inside"}, "amp.dtype is not none"),
    ({"compile.granularity": "sublayer"}, "compile.scope is regional"),
    ({"compile.scope": "regional", "compile.granularity": "nested", "ac.policy": "block"}, "not nested"),
    ({"compile.scope": "none", "compile.fullgraph": True}, "compile.scope is not none"),
    ({"compile.dynamic": True}, "varies sequence length"),
    ({"compile.backend": "eager", "compile.mode": "lite"}, "compile.backend is inductor"),
])
def test_knob_that_does_not_apply_is_rejected_with_its_condition(cpu_env: Env, values: dict, needs: str) -> None:
    with pytest.raises(KnobError, match=needs):
        TrialConfig.from_flat(values, cpu_env)


def test_cudagraph_modes_are_not_offered_on_cpu() -> None:
    cpu = Env.detect("cpu", 1, False)
    cuda = Env.detect("cuda", 1, False)
    assert "reduce-overhead" not in cpu.modes and "max-autotune" not in cpu.modes
    assert {"reduce-overhead", "max-autotune", "default"} <= set(cuda.modes)
    with pytest.raises(KnobError, match="not valid here"):
        TrialConfig.from_flat({"compile.mode": "reduce-overhead"}, cpu)
    assert TrialConfig.from_flat({"compile.mode": "reduce-overhead"}, cuda).compile.mode == "reduce-overhead"


def test_fp16_only_on_cuda() -> None:
    with pytest.raises(KnobError, match=r"amp\.dtype='float16'"):
        TrialConfig.from_flat({"amp.dtype": "float16"}, Env.detect("cpu", 1, False))
    assert TrialConfig.from_flat({"amp.dtype": "float16"}, Env.detect("cuda", 1, False)).amp.dtype == "float16"


def test_compiled_autograd_allows_only_the_python_reducer() -> None:
    ddp = Env.detect("cpu", 2, False)
    config = TrialConfig.from_flat({"compile.compiled_autograd": True}, ddp)
    assert config.ddp.optimize == "python_reducer"  # the default is ruled out, so the valid one is taken
    for cpp_mode in ("ddp_optimizer", "no_optimization"):
        with pytest.raises(KnobError, match="python_reducer"):
            TrialConfig.from_flat({"compile.compiled_autograd": True, "ddp.optimize": cpp_mode}, ddp)
    with pytest.raises(KnobError):  # a no-op without compiled autograd
        TrialConfig.from_flat({"ddp.optimize": "python_reducer"}, ddp)


def test_unknown_knob_and_value_name_the_fix(cpu_env: Env) -> None:
    with pytest.raises(KnobError, match=r"unknown knob 'compile\.scoop'"):
        TrialConfig.from_flat({"compile.scoop": "module"}, cpu_env)
    with pytest.raises(KnobError, match="choose one of 'none', 'module', 'regional', 'train_step'"):
        TrialConfig.from_flat({"compile.scope": "everything"}, cpu_env)


def test_inactive_knobs_are_not_part_of_the_identity(cpu_env: Env) -> None:
    eager = TrialConfig.from_flat({"compile.scope": "none"}, cpu_env)
    # optim.impl applies to eager too (cpu_env knows no workload: every optimizer implementation is offered).
    assert set(eager.active(cpu_env)) == {"compile.scope", "amp.dtype", "ac.policy", "optim.impl"}
    # Non-strict validation drops a study-wide fixed knob that does not apply to this trial.
    loose = TrialConfig.from_flat({"compile.scope": "none", "amp.placement": "inside"}, cpu_env, strict=False)
    assert loose == eager
    assert describe(eager, cpu_env) == "compile.scope=none"


def test_mode_and_options_are_never_passed_together(cpu_env: Env) -> None:
    plain = cfg(cpu_env, compile__mode="max-autotune-no-cudagraphs")
    assert compile_kwargs(plain.compile)["mode"] == "max-autotune-no-cudagraphs"
    merged = compile_kwargs(cfg(cpu_env, compile__mode="max-autotune-no-cudagraphs",
                                compile__options__shape_padding=False).compile)
    assert "mode" not in merged
    assert merged["options"] == {"max_autotune": True, "coordinate_descent_tuning": True, "shape_padding": False}


def test_fused_optimizer_is_not_offered_where_the_optimizer_step_is_compiled(cpu_env: Env) -> None:
    """Dynamo runs a fused kernel uncompiled (torch.compiler.disable): compiling that step is a graph break."""
    for compiled_step in ({"compile.optimizer": True}, {"compile.scope": "train_step"}):
        with pytest.raises(KnobError, match=r"optim.impl='fused' is not valid here.*optimizer step is not compiled"):
            TrialConfig.from_flat({**compiled_step, "optim.impl": "fused"}, cpu_env)
    assert TrialConfig.from_flat({"compile.optimizer": False, "optim.impl": "fused"}, cpu_env).optim.impl == "fused"
    import torch
    from torch._dynamo.utils import counters

    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    torch._dynamo.reset()
    counters.clear()
    model(torch.randn(2, 8)).sum().backward()
    torch.compile(optimizer.step, backend="eager")()
    assert not counters["stats"]["unique_graphs"]  # the fact the rule rests on: nothing of the step compiles


def test_search_space_size_counts_distinct_configurations(cpu_env: Env) -> None:
    from autocompile.config.space import SearchSpace

    # Eager: only amp.dtype (none, bfloat16), ac.policy (none, block) and optim.impl (default, for_loop,
    # foreach, fused: cpu_env knows no workload) remain; placement etc. are inactive.
    assert SearchSpace(cpu_env, {"compile.scope": "none"}).size() == 4 * 4
    eager_regional = SearchSpace(cpu_env, {"compile.scope": "regional", "compile.backend": "eager"})
    # fullgraph 2 x optimizer 2 x compiled autograd 2 x (amp: none, bf16 x 2 placements) 3 x placement.order 2
    # x (granularity block or sublayer x rest compiled/eager 2 x ac 2, or nested without ac or rest) 9
    # x optim.impl (4 with the optimizer eager, 3 compiled: no fused) x optim.clip 2 (tensor_lr is not searched)
    assert eager_regional.size() == 2 * 2 * 3 * 2 * (2 * 2 * 2 + 1) * (4 + 3) * 2


def test_a_knob_whose_values_earlier_knobs_narrow_is_its_own_optuna_parameter(cpu_env: Env) -> None:
    """optim.impl offers fused only with the optimizer step eager; Optuna refuses one name with two value sets."""
    import optuna

    from autocompile.config.space import SearchSpace

    space = SearchSpace(cpu_env, {"compile.backend": "eager"})
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = {}
    for _ in range(60):
        trial = study.ask()
        config = space.sample(trial)
        study.tell(trial, 1.0)
        seen[config.compile.optimizer or config.compile.scope == "train_step"] = trial.params
    assert "optim.impl" in seen[False] and "optim.impl[default|for_loop|foreach]" in seen[True]
    # A configuration's params, enqueued, give it back (baselines, confirmation and verdict repeats rely on it).
    for flat in (space.sample(study.ask()).flat(), {**TrialConfig().flat(), "compile.optimizer": True,
                                                     "compile.backend": "eager", "optim.impl": "foreach"}):
        study.enqueue_trial(space.params(flat))
        assert space.sample(study.ask()).flat() == TrialConfig.from_flat(flat, cpu_env).flat()


def test_cuda_graph_modes_are_not_offered_when_the_workload_accumulates_gradients() -> None:
    """Issue 27 finding 1: each micro-batch's replay overwrites the gradients AccumulateGrad took from the graph
    pool (torch/_inductor/cudagraph_trees.py format_dealloc_msg, is_grad_output). workload.grad_accum_steps
    reaches the knob table through parts.knob_facts."""
    from autocompile.config.spec import Workload
    from autocompile.workload.parts import knob_facts

    cuda = Env.detect("cuda", 1, False, job=knob_facts(Workload(grad_accum_steps=1), "cuda"))
    accumulating = Env.detect("cuda", 1, False, job=knob_facts(Workload(grad_accum_steps=4), "cuda"))
    assert {"reduce-overhead", "max-autotune"} <= set(cuda.graph_modes) and not Env.detect("cpu", 1, False).graph_modes
    assert accumulating.accumulates and not cuda.accumulates
    mode = KNOBS["compile.mode"][0]
    assert not set(mode.allowed(TrialConfig().flat(), accumulating)) & set(cuda.graph_modes)
    assert {"default", "max-autotune-no-cudagraphs"} <= set(mode.allowed(TrialConfig().flat(), accumulating))
    for graphed in cuda.graph_modes:
        assert TrialConfig.from_flat({"compile.mode": graphed}, cuda).compile.mode == graphed
        with pytest.raises(KnobError, match=rf"compile.mode='{graphed}' is not valid here.*grad_accum_steps=1"):
            TrialConfig.from_flat({"compile.mode": graphed}, accumulating)


def test_fp16_is_offered_to_a_train_step_in_a_cuda_graph_mode() -> None:
    """Issue 27 finding 7, rejected by measurement: GradScaler.update() inside a compiled train step under
    reduce-overhead kept its CUDA graphs on an H100 with torch 2.11 (0 cudagraph_skips,
    benchmarks/results/h100/pytest.log); a torch that skips them fails the trial as cudagraphs_skipped."""
    cuda = Env.detect("cuda", 1, False)
    fp16 = {"compile.scope": "train_step", "compile.mode": "reduce-overhead", "amp.dtype": "float16"}
    assert TrialConfig.from_flat(fp16, cuda).amp.dtype == "float16"


@pytest.mark.parametrize(("fixed", "ruled_out"), [
    ({"compile.scope": "module", "optim.impl": "fused"}, lambda v: v["compile.optimizer"]),
], ids=["fused"])
def test_a_fixed_knob_narrows_the_earlier_knobs_it_depends_on(fixed: dict, ruled_out) -> None:
    """A study that fixes a fused optimizer never samples a compiled optimizer step: every configuration the space
    walks is valid with the fixed values."""
    from autocompile.config.space import SearchSpace

    cuda = Env.detect("cuda", 1, False, job={"scheduled": False, "clips": False})
    small = {"compile.backend": "inductor", "ac.policy": "none", "compile.compiled_autograd": False}
    space = SearchSpace(cuda, {**small, **fixed})
    configurations = space.configurations()
    assert len(configurations) == space.size() > 1
    for values in configurations:
        config = TrialConfig.from_flat(values, cuda)  # a KnobError before the narrowing
        assert {k: config.flat()[k] for k in fixed} == fixed and not ruled_out(values)


def annotations_of(cls: type, prefix: str = "") -> dict[str, str]:
    """Each knob's annotation as written in its group's dataclass (``compile.scope`` -> ``"Scope"``)."""
    import dataclasses

    found = {}
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        if key in KNOBS:
            found[key] = str(f.type)
        elif f.default_factory is not dataclasses.MISSING:
            found |= annotations_of(f.default_factory, f"{key}.")  # type: ignore[arg-type]
    return found


def test_every_closed_choice_is_a_literal_that_holds_the_knobs_values() -> None:
    """Issue 34: a knob with a closed set of string values is annotated with its ``Literal`` (config/choices.py),
    and every value the knob table may offer, on any device, is one of the Literal's: a misspelt value or a
    value added in one place only fails here."""
    from typing import get_args

    from autocompile.config import choices

    annotations = annotations_of(TrialConfig)
    envs = [Env.detect("cuda", 2, True), Env.detect("cpu", 1, False), Env(device="cuda", world_size=2, modes=(
        "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"))]
    string_knobs = [key for key, (spec, default) in KNOBS.items() if isinstance(default, str)]
    assert len(string_knobs) >= 15
    for key in string_knobs:
        literal = getattr(choices, annotations[key], None)
        assert literal is not None and get_args(literal), f"{key} is annotated {annotations[key]}, not a Literal"
        spec, default = KNOBS[key]
        offered = {default}
        for env in envs:
            for compiled_autograd in (False, True):
                flat = {k: d for k, (_, d) in KNOBS.items()} | {"compile.compiled_autograd": compiled_autograd}
                offered |= set(spec.values(flat, env) if callable(spec.values) else spec.values)
        assert offered <= set(get_args(literal)), (key, offered - set(get_args(literal)))
