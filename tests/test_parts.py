"""The workload's parts: user factories of each kind, accumulation, clipping, the schedule, and the
optimizer knobs (implementation, the tensor-LR recipe)."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.spec import Workload
from autocompile.trial.program.step import apply
from autocompile.workload.losses import cross_entropy
from autocompile.workload.parts import knob_facts
from tests.conftest import assert_ok, launched, run_trials
from tests.conftest import tiny_lm as tiny_lm_spec
from tests.jobs import FAST_MEASURE, Compose, falls, run_job
from tests.models import tiny_lm

AOT = {"compile.backend": "aot_eager"}
USER_PARTS = ("+model=custom", "model._target_=tests.models.tiny_lm", "workload.batch_size=4", "workload.seq_len=[16]",
              "workload.data._target_=tests.parts.batches", "workload.loss._target_=tests.parts.smoothed_loss",
              "+workload.loss.smoothing=0.1", "workload.optimizer._target_=tests.parts.sgd",
              "workload.lr_schedule._target_=tests.parts.warmup", "+workload.lr_schedule.steps=3",
              "workload.grad_clip_norm=1.0", "workload.grad_accum_steps=2", *FAST_MEASURE)


def test_user_data_loss_optimizer_and_schedule_run_a_trial_ok(tmp_path: Path, settings_for: Compose) -> None:
    settings = settings_for(*USER_PARTS, "measure.windows=4")
    configs = [{"compile.scope": "none"}, {"compile.scope": "module", "compile.optimizer": True, **AOT}]
    results = run_trials(tmp_path, [settings.trial_spec(TrialConfig.from_flat(k, settings.env)) for k in configs])
    for result in results:
        assert_ok(result)
        assert falls(result["losses"]), result["losses"]
        assert result["window_steps"] % 2 == 0 and result["warmup_steps"] % 2 == 0  # whole optimizer steps
        assert result["recompiles_timed"] == 0
    eager, compiled = results
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=1e-4)


def test_the_parts_reach_the_step(settings_for: Compose) -> None:
    settings = settings_for(*USER_PARTS)
    step, _, _ = run_job(settings, {"compile.scope": "none"}, steps=8)
    assert isinstance(step.optimizer, torch.optim.SGD) and step.optimizer.defaults["momentum"] == 0.9
    assert step.scheduler.last_epoch == 4  # 8 micro-batches, 2 per optimizer step
    # Warmed up over 3 steps to the configured LR: the default config's lr key stays under a new _target_.
    assert step.optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)


def _trained(knobs: dict[str, Any], batches: list[tuple[torch.Tensor, torch.Tensor]], **parts: Any) -> torch.nn.Module:
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = tiny_lm()
    config = TrialConfig.from_flat({**AOT, **knobs}, Env.detect("cpu", 1, False), strict=False)
    step = apply(model, functools.partial(torch.optim.SGD, lr=0.1), cross_entropy, config, **parts)
    for inputs, targets in batches:
        step(inputs, targets)
    return model


def _ids(seed: int, batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 64, (batch, 17), generator=torch.Generator().manual_seed(seed))
    return ids[:, :-1], ids[:, 1:]


def _params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("scope", ["none", "module", "train_step"])
def test_accumulating_two_halves_equals_one_whole_batch(scope: str) -> None:
    whole = [_ids(s) for s in range(3)]
    halves = [(x[i:i + 2], y[i:i + 2]) for x, y in whole for i in (0, 2)]
    once = _trained({"compile.scope": scope}, whole)
    accumulated = _trained({"compile.scope": scope}, halves, grad_accum_steps=2)
    assert torch.allclose(_params(accumulated), _params(once), atol=1e-6)


@pytest.mark.parametrize("knobs,compiled", [
    ({"compile.scope": "none"}, []),
    ({"compile.scope": "module", "optim.clip": "eager"}, ["model"]),
    ({"compile.scope": "module", "optim.clip": "compiled"}, ["model", "clip_grad_norm_"]),
    ({"compile.scope": "module", "compile.optimizer": True, "optim.clip": "compiled"},
     ["model", "optimizer.step+clip_grad_norm_"]),
    ({"compile.scope": "train_step"}, ["train_step"]),
])
def test_clipping_acts_wherever_it_sits(knobs: dict[str, Any], compiled: list[str]) -> None:
    batches = [_ids(s) for s in range(3)]
    unclipped = _trained({"compile.scope": "none"}, batches)
    reference = _trained({"compile.scope": "none"}, batches, grad_clip_norm=0.01)
    clipped = _trained(knobs, batches, grad_clip_norm=0.01)
    assert torch.allclose(_params(clipped), _params(reference), atol=1e-6)
    assert not torch.allclose(_params(clipped), _params(unclipped), atol=1e-4)  # the clip really bounds the update
    torch._dynamo.reset()
    config = TrialConfig.from_flat({**AOT, **knobs}, Env.detect("cpu", 1, False), strict=False)
    model = tiny_lm()
    step = apply(model, functools.partial(torch.optim.SGD, lr=0.1), cross_entropy, config, grad_clip_norm=0.01)
    step(*batches[0])
    assert step.compiled == compiled


def _frames_per_step(tensor_lr: bool, steps: int = 8) -> list[int]:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = tiny_lm()
    config = TrialConfig.from_flat({"compile.scope": "module", "compile.optimizer": True, "optim.tensor_lr": tensor_lr,
                                    **AOT}, Env.detect("cpu", 1, False))
    # foreach is CUDA's default: the implementation whose float LR dynamo specialises at every step.
    step = apply(model, functools.partial(torch.optim.AdamW, lr=1e-3, foreach=True), cross_entropy, config,
                 lr_schedule=functools.partial(torch.optim.lr_scheduler.LinearLR, start_factor=0.1, total_iters=100))
    frames = []
    for i in range(steps):
        step(*_ids(i))
        frames.append(counters["frames"]["total"])
    return [b - a for a, b in itertools.pairwise(frames)]


def test_compiled_optimizer_under_a_schedule_recompiles_every_step_without_the_tensor_lr_recipe() -> None:
    assert all(new > 0 for new in _frames_per_step(False, steps=6)[:5])  # a recompile per step (then the limit)
    assert _frames_per_step(True)[1:] == [0] * 6  # with a tensor LR: compiled once, never again


# Two real trials, one recompiling to its limit (25-35 s). Default run: the recipe in process,
# test_compiled_optimizer_under_a_schedule_recompiles_every_step_without_the_tensor_lr_recipe, and a real trial's
# recompile in its timed part, test_a_shape_change_in_the_timed_part_names_the_guard_that_failed.
@pytest.mark.integration
def test_a_trial_with_the_recipe_has_no_recompiles_in_its_timed_part_and_fails_without(
        tmp_path: Path, settings_for: Compose) -> None:
    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", "workload.batch_size=2",
                            "workload.seq_len=[16]", "+workload.optimizer.foreach=true",
                            "workload.lr_schedule._target_=torch.optim.lr_scheduler.LinearLR",
                            "+workload.lr_schedule.start_factor=0.1", "+workload.lr_schedule.total_iters=1000",
                            *FAST_MEASURE)
    base = {"compile.scope": "module", "compile.optimizer": True, **AOT}
    configs = [TrialConfig.from_flat({**base, "optim.tensor_lr": t}, settings.env) for t in (True, False)]
    recipe, without = run_trials(tmp_path, [settings.trial_spec(c) for c in configs])
    assert_ok(recipe)
    assert recipe["recompiles_timed"] == 0 and recipe["rewarm_steps"] == 0
    assert without["status"] == "failed" and without["failure"] in ("recompile_limit", "compile_in_timed_part"), \
        without.get("reason")


def test_optimizer_implementations_are_offered_where_the_optimizer_takes_them() -> None:
    adamw = Workload(optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "lr": 1e-3})
    assert knob_facts(adamw, "cpu")["optimizer_impls"] == ("foreach", "fused")  # the for-loop is CPU's default
    fixed = Workload(optimizer={"_target_": "torch.optim.AdamW", "_partial_": True, "fused": True})
    assert knob_facts(fixed, "cpu")["optimizer_impls"] == ()  # the workload decided
    user = Workload(optimizer={"_target_": "tests.parts.sgd", "_partial_": True})
    assert knob_facts(user, "cpu")["optimizer_impls"] == ()  # its factory names neither
    env = Env.detect("cpu", 1, False, job=knob_facts(adamw, "cpu"))
    assert TrialConfig.from_flat({"optim.impl": "fused"}, env).optim.impl == "fused"


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_the_implementation_knob_builds_the_optimizer_with_it(impl: str) -> None:
    config = TrialConfig.from_flat({"compile.scope": "none", "optim.impl": impl}, Env.detect("cpu", 1, False))
    model = tiny_lm()
    step = apply(model, functools.partial(torch.optim.AdamW, lr=1e-3), cross_entropy, config)
    assert step.optimizer.defaults[impl] is True
    losses = [float(step(*_ids(0))) for _ in range(3)]
    assert losses[-1] < losses[0]
    # An instance (what a user's script holds) is rebuilt with the implementation, keeping its hyperparameters.
    model = tiny_lm()
    mine = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.2)
    step = apply(model, mine, cross_entropy, config)
    group = step.optimizer.param_groups[0]
    assert type(step.optimizer) is torch.optim.AdamW and group[impl] is True
    assert (group["lr"], group["weight_decay"]) == (3e-3, 0.2) and group["params"][0] is next(model.parameters())
    losses = [float(step(*_ids(0))) for _ in range(3)]
    assert losses[-1] < losses[0]
    with pytest.raises(ValueError, match=r"optim.impl=fused needs an optimizer that has not stepped yet"):
        apply(model, step.optimizer, cross_entropy,
              TrialConfig.from_flat({"optim.impl": "fused"}, Env.detect("cpu", 1, False)))


# A two-rank torchrun trial each: compile_of_ddp is integration (default run: ddp_of_compiled, the default order,
# here; compile_of_ddp in process: test_apply_parts.py::test_compile_of_ddp_compiles_the_wrapper_and_every_weight_...).
@pytest.mark.parametrize("wrap", ["ddp_of_compiled", pytest.param("compile_of_ddp", marks=pytest.mark.integration)])
def test_accumulation_and_clipping_under_ddp_keep_ranks_identical(tmp_path: Path, wrap: str) -> None:
    import dataclasses

    from tests.conftest import make_spec

    spec = make_spec({"compile.scope": "module", "compile.backend": "eager", "ddp.wrap_order": wrap},
                     model=tiny_lm_spec(), nproc=2)
    spec = dataclasses.replace(spec, workload=dataclasses.replace(spec.workload, grad_accum_steps=2,
                                                                  grad_clip_norm=1.0))
    result = launched(tmp_path / "t", spec)
    assert_ok(result)
    first, second = result["param_checksums"]
    assert first == second and result["window_steps"] % 2 == 0  # DDP no_sync on the first micro-batch of each step


def test_a_shape_change_in_the_timed_part_names_the_guard_that_failed(tmp_path: Path, settings_for: Compose) -> None:
    """Issue 37: a trial whose data changes shape after the warm-up recompiles in its timed part; the re-warmed
    trial records which guard failed, as ``TORCH_LOGS=recompiles`` says it (a trial that never settles fails
    with the same words in its reason: ``worker.Trial.run``)."""
    settings = settings_for("+model=custom", "model._target_=tests.models.tiny_lm", "workload.batch_size=2",
                            "workload.seq_len=[16]", *FAST_MEASURE, "measure.windows=3",
                            "workload.data._target_=tests.parts.curriculum_batches", "+workload.data.longer_from=7")
    knobs = {"compile.scope": "module", **AOT}
    (settled,) = run_trials(tmp_path, [settings.trial_spec(TrialConfig.from_flat(knobs, settings.env))])
    assert settled["status"] == "ok", settled.get("reason")  # (its items per step are not the declared ones)
    assert settled["rewarm_steps"] > 0 and settled["recompiles_timed"] == 0  # re-warmed once, then steady
    assert any("size mismatch" in r and "expected 16, actual 32" in r for r in settled["recompile_reasons"]), \
        settled["recompile_reasons"]


def test_recompile_reasons_are_the_guards_that_failed_since_a_snapshot() -> None:
    from autocompile.trial.timing.readings import guard_failure_counts, recompile_reasons

    @torch.compile(backend="eager", dynamic=False)
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    double(torch.ones(2))
    before = guard_failure_counts()
    assert recompile_reasons(before) == []
    double(torch.ones(3))
    (reason,) = recompile_reasons(before)
    assert reason.startswith("double (test_parts.py:") and "size mismatch at index 0. expected 2, actual 3" in reason
    assert recompile_reasons(guard_failure_counts()) == []
