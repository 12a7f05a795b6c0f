"""Search strategies: the plans name the configurations they promise, and the replay answers from a table."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import optuna
import pytest

from autocompile.config.knobs import TrialConfig
from autocompile.config.space import SearchSpace, identity
from autocompile.study.replay import Noise, Row, best_time_to_train, load_table, replay
from autocompile.study.search.samplers import SHARED, kept, make_sampler, shared_order
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE, prune_margin

GPT2_TINY = ["+model=gpt2-tiny", "workload.device=cpu", "compile.mode=default", "compile.granularity=block",
             "compile.fullgraph=false", "placement.order=to_then_compile", "amp.placement=outside"]
HORIZON = 10_000
QUIET = Noise(0, 0, 0, 0)
"""A noiseless replay: every measurement reads the table."""


@pytest.fixture
def space(settings_for: Any) -> SearchSpace:
    settings = settings_for(*GPT2_TINY)
    return SearchSpace(settings.env, settings.fixed_knobs)


def made_up(space: SearchSpace, fused: float = 0.08) -> dict[str, Row]:
    """A table whose best is certain: eager, fused AdamW (``fused`` faster), no AMP or checkpointing;
    compiled programs step 10 % faster but pay 20 s of compile, so over 10 000 steps of ~14 ms none
    catches up."""
    table = {}
    for flat in space.configurations():
        eager = flat["compile.scope"] == "none"
        step = 0.014 * (1 + 0.3 * (flat["ac.policy"] == "block") + 0.3 * (flat["amp.dtype"] != "none")
                        - fused * (flat["optim.impl"] == "fused") - 0.1 * (not eager)
                        + 0.01 * (flat.get("compile.scope") == "regional"))
        key = identity(TrialConfig.from_flat(flat, space.env), space.env)
        table[key] = Row(key, True, step, 0.0 if eager else 20.0, 8.0 if eager else 30.0)
    return table


def test_every_measures_each_configuration_once(space: SearchSpace) -> None:
    table = made_up(space)
    run = replay(space, table, make_sampler("every", space, seed=3), len(table), HORIZON, QUIET, seed=0)
    n = len(table)
    assert run.wall_s[n - 1] == pytest.approx(sum(r.wall_s for r in table.values()))  # no configuration twice
    # ... until the near-miss prunes are measured once more, each at its row's cost
    assert run.wall_s[-1] - run.wall_s[n - 1] == pytest.approx(sum(table[k].wall_s for k, _ in run.remeasured))
    assert run.recommended_s[-1] == best_time_to_train(table, HORIZON)


def staged_trials(space: SearchSpace, table: dict[str, Row], n: int, seed: int = 0,
                  margin: float = 0.0) -> tuple[list[dict[str, Any]], Any]:
    """The configurations a noiseless staged study measures, in order, and its replay."""
    study_trials: list[dict[str, Any]] = []
    sampler = make_sampler("staged", space, seed=seed, margin=margin)
    original = sampler.after_trial

    def keep(study: optuna.Study, trial: optuna.trial.FrozenTrial, *args: Any) -> None:
        study_trials.append(trial.user_attrs["config"])
        original(study, trial, *args)

    sampler.after_trial = keep  # type: ignore[method-assign]
    return study_trials, replay(space, table, sampler, n, HORIZON, QUIET, seed=0, prune=False)


def test_staged_starts_where_a_practitioner_starts_then_settles_the_shared_knobs_on_each_kind(
        space: SearchSpace) -> None:
    table = made_up(space)
    study_trials, run = staged_trials(space, table, 18)  # noiseless: no margin needed
    scopes = [c["compile.scope"] for c in study_trials]
    assert scopes[:4] == ["none", "module", "regional", "train_step"]  # the queued baselines, then the train step
    # The leader (eager here: compile does not pay back), one shared knob at a time: bfloat16, checkpointing,
    # foreach, fused (4 runs, no compile) ...
    assert scopes[4:8] == ["none"] * 4
    assert {(k, study_trials[i][k]) for i in range(4, 8) for k in SHARED if study_trials[i][k] != study_trials[0][k]} \
        == {("amp.dtype", "bfloat16"), ("ac.policy", "block"), ("optim.impl", "foreach"), ("optim.impl", "fused")}
    # ... then the same on the best compiled lead program (precision and scope are not independent) ...
    compiled_lead = min(study_trials[1:4], key=lambda c: table[key_of(space, c)].step_s)
    # (compiled, checkpointing has compile's memory budgets too: 6 changes)
    assert all(c["compile.scope"] == compiled_lead["compile.scope"] for c in study_trials[8:14])
    assert {(k, c[k]) for c in study_trials[8:14] for k in SHARED if c[k] != compiled_lead[k]} >= {
        ("amp.dtype", "bfloat16"), ("ac.policy", "block"), ("ac.policy", "budget_0.5"), ("ac.policy", "budget_0.25"),
        ("optim.impl", "foreach"), ("optim.impl", "fused")}
    # ... then one compiled knob at a time from the compiled program with fused AdamW.
    assert all(c["compile.scope"] != "none" for c in study_trials[14:16])
    assert [c["optim.impl"] for c in study_trials[14:16] if not c.get("compile.optimizer")] == ["fused"]
    assert run.recommended_s[7] == best_time_to_train(table, HORIZON)  # found by its 8th trial, 5 of them eager


def key_of(space: SearchSpace, flat: dict[str, Any]) -> str:
    return identity(TrialConfig.from_flat(flat, space.env), space.env)


def test_the_lead_precision_is_where_the_baselines_and_the_train_step_start(settings_for: Any) -> None:
    """Issue 35: on a GPU that runs bf16 natively the first trials are what a practitioner tries there: eager,
    module, regional and the compiled train step, all in bf16 autocast; fp32 is a one-knob change after."""
    settings = settings_for(*GPT2_TINY)
    lead = SearchSpace(settings.env, settings.fixed_knobs, lead={"amp.dtype": "bfloat16"})
    table = made_up(lead)
    study_trials, _ = staged_trials(lead, table, 6)
    assert [(c["compile.scope"], c["amp.dtype"]) for c in study_trials[:4]] == [
        ("none", "bfloat16"), ("module", "bfloat16"), ("regional", "bfloat16"), ("train_step", "bfloat16")]
    assert ("none", "none") in [(c["compile.scope"], c["amp.dtype"]) for c in study_trials[4:6]] or \
        study_trials[4]["amp.dtype"] == "bfloat16"  # fp32 comes as a one-knob change of the leader
    fixed = SearchSpace(settings.env, {**settings.fixed_knobs, "amp.dtype": "none"}, lead={"amp.dtype": "bfloat16"})
    assert fixed.lead == {} and fixed.start()["amp.dtype"] == "none"  # a fixed amp.dtype wins


def test_start_precision_auto_is_bf16_only_on_a_gpu_that_runs_it(settings_for: Any,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from autocompile.config import space as space_module

    assert settings_for(*GPT2_TINY).lead_knobs == {}  # a CPU: fp32 first
    assert settings_for(*GPT2_TINY, "study.start_precision=bfloat16").lead_knobs == {"amp.dtype": "bfloat16"}
    assert settings_for(*GPT2_TINY, "study.start_precision=bfloat16", "amp.dtype=none").lead_knobs == {}
    settings = settings_for(*GPT2_TINY)
    monkeypatch.setattr(space_module, "native_bf16", lambda: True)
    object.__setattr__(settings, "device", "cuda")
    settings.__dict__.pop("lead_knobs", None)
    assert settings.lead_knobs == {"amp.dtype": "bfloat16"}
    monkeypatch.setattr(space_module, "native_bf16", lambda: False)  # a V100, a T4: fp32 first
    settings.__dict__.pop("lead_knobs", None)
    assert settings.lead_knobs == {}
    with pytest.raises(Exception, match=r"study.start_precision='fp8': choose one of auto, none, bfloat16"):
        settings_for(*GPT2_TINY, "study.start_precision=fp8")


def test_seeds_explore_the_knobs_in_different_orders_lead_scopes_first(space: SearchSpace) -> None:
    """Issue 26: three seeds ran the same configurations (agreement by construction); now the seed orders
    the knobs within each stage, and the lead scopes still come first."""
    table = made_up(space)
    paths = [staged_trials(space, table, 14, seed=seed)[0] for seed in range(4)]
    assert len({str(p) for p in paths}) > 1
    for path in paths:
        assert [c["compile.scope"] for c in path[:4]] == ["none", "module", "regional", "train_step"]
        assert [c["compile.scope"] for c in path[4:8]] == ["none"] * 4


def test_a_near_tie_keeps_the_incumbent_a_clear_gain_is_taken(space: SearchSpace) -> None:
    """A change is kept on one noisy measurement only beyond the noise of one alone process: fused AdamW 5 %
    faster (within the 8.6 % margin) leaves the compiled knobs' stage starting from the default optimizer."""
    assert not kept(0.95, 1.0, PRIOR_ALONE_NOISE) and kept(0.90, 1.0, PRIOR_ALONE_NOISE)
    assert not kept(-1.05, -1.0, PRIOR_ALONE_NOISE) and kept(-1.10, -1.0, PRIOR_ALONE_NOISE)  # minus throughput
    # Trials 14 on are the compiled knobs' stage (4 lead scopes, 4 shared changes on eager, 6 on module); a
    # compiled optimizer step takes fused away (one knob changed, made valid), every other change keeps it.
    near, _ = staged_trials(space, made_up(space, fused=0.05), 18, margin=PRIOR_ALONE_NOISE)
    # (two here: the compiled optimizer step and the placement order; TPE after them).
    assert all(c["compile.scope"] != "none" and c["optim.impl"] != "fused" for c in near[14:16])
    taken, _ = staged_trials(space, made_up(space, fused=0.12), 18, margin=PRIOR_ALONE_NOISE)
    assert all(c["compile.scope"] != "none" for c in taken[14:16])
    assert [c["optim.impl"] for c in taken[14:16] if not c.get("compile.optimizer")] == ["fused"]


def test_the_replay_prunes_exactly_when_the_tuners_rule_does(space: SearchSpace) -> None:
    """Noiseless, every configuration in a seeded order: a search trial is pruned exactly when its time to train
    exceeds the best complete one's by the tuner's noise-aware margin (the prior alone noise, the best of k)."""
    table = made_up(space)
    run = replay(space, table, make_sampler("every", space, seed=1), 40, HORIZON, QUIET, seed=0)
    scores: list[float] = []
    pruned = 0
    for i, (key, state) in enumerate(run.states):
        row = table[key]
        value = row.compile_s + HORIZON * row.step_s
        baseline = i < 3  # the queued baselines are never pruned
        expect = not baseline and bool(scores) and value > min(scores) * math.exp(
            prune_margin(PRIOR_ALONE_NOISE, 0.0, len(scores)))
        assert (state == optuna.trial.TrialState.PRUNED) == expect, (i, key)
        pruned += expect
        if not expect:
            scores.append(value)
    assert pruned > 0
    replayed = replay(space, table, make_sampler("every", space, seed=1), 40, HORIZON, QUIET, seed=0, prune=False)
    assert all(state == optuna.trial.TrialState.COMPLETE for _, state in replayed.states)


def test_a_near_miss_prune_of_the_best_is_recovered_by_the_remeasure(space: SearchSpace) -> None:
    """Provisional pruning in the replay, as ``tuner.Runner.remeasure``: with the records' noise (seed 410, staged,
    10 trials) the true best (eager with fused AdamW, 6 % ahead) has its one first window pruned, so without a
    re-measure the study recommends a program 6 % slower; ``objective.near_misses`` picks it from the replayed
    study, its second measurement completes, and the confirmation recommends it."""
    table = made_up(space, fused=0.06)
    best = best_time_to_train(table, HORIZON)
    key = min(table, key=lambda k: table[k].compile_s + HORIZON * table[k].step_s)
    noise = Noise(processes=5)  # the scenario's draws, found when the confirmation ran 5 processes
    runs = {n: replay(space, table, make_sampler("staged", space, seed=410), 10, HORIZON, noise, seed=410,
                      remeasure_pruned=n) for n in (0, 2)}
    assert (key, optuna.trial.TrialState.PRUNED) in runs[0].states and not runs[0].remeasured
    assert runs[0].recommended_s[-1] > best * 1.02  # a pruned trial never reaches the confirmation
    assert runs[2].states == runs[0].states  # the same search: the re-measures draw their noise after it
    assert (key, optuna.trial.TrialState.COMPLETE) in runs[2].remeasured
    assert len(runs[2].wall_s) == 10 + len(runs[2].remeasured)  # search trials beyond n_trials, each at its cost
    assert runs[2].wall_s[-1] - runs[2].wall_s[9] == pytest.approx(sum(table[k].wall_s for k, _ in runs[2].remeasured))
    assert runs[2].recommended_s[-1] == best


def test_a_new_sampler_continues_the_plan_of_a_resumed_study(space: SearchSpace, tmp_path: Path) -> None:
    """The plan is read from the trials: a second tuner (or a resumed one) never repeats what is measured."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(tmp_path / "j")))
    table = made_up(space)
    seen = []
    for part in range(2):
        study = optuna.create_study(study_name="s", storage=storage, load_if_exists=True,
                                    sampler=make_sampler("staged", space, seed=part))
        for _ in range(5):
            trial = study.ask()
            config = space.sample(trial)
            key = identity(config, space.env)
            trial.set_user_attr("identity", key)
            seen.append(key)
            study.tell(trial, table[key].compile_s + HORIZON * table[key].step_s)
    assert len(set(seen)) == 10


def test_trials_asked_together_are_planned_different_configurations(space: SearchSpace) -> None:
    """Slots ask before they sample: a queued baseline and a trial another slot was just planned count as
    taken, so no slot waits on a twin while the plan has other configurations to offer."""
    study = optuna.create_study(sampler=make_sampler("staged", space, seed=0))
    study.enqueue_trial(space.baseline_params("eager"))
    trials = [study.ask() for _ in range(4)]  # four slots, none has sampled yet
    keys = [identity(space.sample(t), space.env) for t in trials]
    assert len(set(keys)) == 4
    assert sorted(k.split("compile.scope=")[1].split(",")[0] for k in keys) == sorted(  # the four lead scopes
        ["'none'", "'module'", "'regional'", "'train_step'"])


def test_the_table_loads_failed_rows_as_never_best(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["identity", "status", "step_ms", "compile_s", "wall_s"])
        writer.writeheader()
        writer.writerow({"identity": "a", "status": "ok", "step_ms": "10", "compile_s": "5", "wall_s": "20"})
        writer.writerow({"identity": "b", "status": "failed", "step_ms": "", "compile_s": "", "wall_s": "3"})
    table = load_table(path)
    assert not table["b"].ok and table["b"].wall_s == 3
    assert best_time_to_train(table, 100) == pytest.approx(5 + 100 * 0.010)


def test_an_unknown_sampler_is_refused_with_the_choices(settings_for: Any) -> None:
    with pytest.raises(Exception, match=r"study.sampler=.grid.: choose one of staged, tpe, random, gp, every"):
        settings_for("+model=gpt2-tiny", "study.sampler=grid")


def test_the_shared_knobs_go_first_to_eager_only_while_it_is_within_reach_of_the_leader() -> None:
    """Eager runs cost no compile, so the shared knobs are tried on eager first while eager might still win; on a
    GPU, where the compiled train step trains 2x faster than eager (the H100 table: 314 s against 678 s over
    10 000 steps), the compiled leader's precision and optimizer come first."""
    eager_lead, module, train_step = ({"compile.scope": s} for s in ("none", "module", "train_step"))
    leads = [eager_lead, module, train_step]
    gpu = {"none": 678.0, "module": 380.0, "train_step": 314.0}
    assert shared_order(leads, lambda c: gpu[c["compile.scope"]]) == [train_step, eager_lead]
    cpu = {"none": 145.0, "module": 152.0, "train_step": 141.0}
    assert shared_order(leads, lambda c: cpu[c["compile.scope"]]) == [eager_lead, train_step]
    throughput = {"none": -121e3, "module": -238e3, "train_step": -351e3}  # objective=throughput: minus tokens/s
    assert shared_order(leads, lambda c: throughput[c["compile.scope"]]) == [train_step, eager_lead]
    assert shared_order([eager_lead], lambda c: 1.0) == [eager_lead]
