"""What a script's eager reference run tells its study: its own ``torch.compile`` arguments, queued as the baseline
"as written" (or none, with the reason), and its model's structure and gradient accumulation, which narrow the space
as a model study's build does."""

from __future__ import annotations

from typing import Any

import optuna
import pytest

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.script_settings import script_env
from autocompile.config.space import AS_WRITTEN, SearchSpace
from autocompile.study.search.baselines import as_written, queue_as_written, queue_baselines
from autocompile.study.search.numerics import probed_env


def call(where: str = "train.py:9", **kwargs: str) -> dict[str, Any]:
    """One recorded ``torch.compile`` call, its keyword arguments as ``repr`` (as the agent writes them)."""
    return {"target": "GPT", "module": True, "where": where, "kwargs": kwargs}


@pytest.mark.parametrize(("calls", "knobs", "why"), [
    ([call(fullgraph="True", dynamic="False")],
     {"compile.scope": "module", "compile.fullgraph": True, "compile.dynamic": False}, ""),
    ([call(mode="'max-autotune-no-cudagraphs'"), call("train.py:30", mode="'max-autotune-no-cudagraphs'")],
     {"compile.scope": "module", "compile.mode": "max-autotune-no-cudagraphs"}, ""),
    ([call(options="{'shape_padding': True}", backend="'aot_eager'")],
     {"compile.scope": "module", "compile.options.shape_padding": True, "compile.backend": "aot_eager"}, ""),
    ([call(mode="'default'"), call("train.py:30", mode="'reduce-overhead'")], None, "pass different arguments"),
    ([call(backend="<function my_backend at 0x7f>")], None, "is not a value a knob takes"),
    ([call(options="{'trace.enabled': True}")], None, "has no knob"),
    ([call(disable="True")], None, "runs eager"),
    ([], None, "runs eager"),
])
def test_the_scripts_compile_arguments_are_knobs_or_the_reason_they_are_not(
        calls: list[dict[str, Any]], knobs: dict[str, Any] | None, why: str) -> None:
    found, reason = as_written(calls)
    assert found == knobs and why in reason


def queued(calls: list[dict[str, Any]], fixed: dict[str, Any] | None = None) -> tuple[optuna.Study, Any]:
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    space = SearchSpace(script_env("cpu", 1), fixed or {})
    queue_baselines(study, space)
    return study, queue_as_written(study, space, calls)


def test_the_script_as_written_is_queued_after_the_baselines_and_samples_as_its_arguments() -> None:
    study, knobs = queued([call(fullgraph="True", dynamic="False")])
    assert knobs is not None
    space = SearchSpace(script_env("cpu", 1), {})
    configs = []
    for _ in range(4):
        trial = study.ask()
        configs.append((trial.user_attrs.get("baseline"), space.sample(trial)))
    assert [b for b, _ in configs] == ["eager", "compile", "regional", AS_WRITTEN]
    written = configs[-1][1]
    assert (written.compile.scope, written.compile.fullgraph, written.compile.dynamic) == ("module", True, False)
    assert written.compile.mode == "default" and written.compile.backend == "inductor"


@pytest.mark.parametrize(("calls", "fixed", "says"), [
    ([call(mode="'default'", fullgraph="False")], {}, "passes the defaults"),
    ([call(fullgraph="True")], {"compile.fullgraph": False}, "contradict the fixed knobs"),
    # a CUDA-graph mode is not offered on a CPU: the baseline would time another program
    ([call(mode="'reduce-overhead'")], {}, "compile.mode='reduce-overhead' is not offered here"),
    ([call(mode="'max-autotune-no-cudagraphs'")], {"compile.backend": "aot_eager"}, "is not offered here"),
])
def test_arguments_the_space_cannot_run_as_written_queue_nothing_and_say_why(
        calls: list[dict[str, Any]], fixed: dict[str, Any], says: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO", logger="autocompile.study.search.baselines"):
        study, knobs = queued(calls, fixed)
    assert knobs is None
    assert not [t for t in study.get_trials() if t.user_attrs.get("baseline") == AS_WRITTEN]
    assert says in caplog.text


def test_the_reference_runs_structure_and_accumulation_narrow_a_scripts_space() -> None:
    env = script_env("cpu", 1)
    assert probed_env(env, None) is env and probed_env(env, {"status": "ok"}) is env  # nothing seen: all offered
    flat = SearchSpace(probed_env(env, {"structure": {"has_blocks": False, "splits_blocks": False, "has_rest": True,
                                                      "same_blocks": True}}), {})
    assert "regional" in SearchSpace(env, {}).options("compile.scope", {})
    assert "regional" not in flat.options("compile.scope", {})  # no repeated blocks: no regional trial
    # On a GPU, a script that calls backward() twice per step is offered no CUDA-graph mode.
    cuda = Env(device="cuda", modes=("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
               graph_modes=("reduce-overhead",), script_mode=True)
    compiled = {"compile.scope": "module", "compile.backend": "inductor"}
    assert "reduce-overhead" in SearchSpace(cuda, {}).options("compile.mode", compiled)
    assert probed_env(cuda, {"backwards_per_step": 1}) is cuda
    accumulating = SearchSpace(probed_env(cuda, {"backwards_per_step": 2}), {})
    assert accumulating.options("compile.mode", compiled) == ("default", "max-autotune-no-cudagraphs")
    assert TrialConfig.from_flat({**compiled, "compile.mode": "max-autotune-no-cudagraphs"}, accumulating.env)
