"""Issue 49: the side-by-side verdict phase is laid out once (:func:`phase_plan.verdict_side_plan`); the runner runs
that plan and the estimate prices it, so what the estimate charges is what the phase runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
from optuna.trial import TrialState, create_trial

from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace, identity
from autocompile.study.phases.phase_plan import Foresight, verdict_side_plan
from autocompile.study.phases.plans import asked
from autocompile.study.phases.run import PhaseSettings, verdicts_together
from autocompile.study.records.objective import Objective
from autocompile.study.records.record import TrialRecord, set_attrs

Compose = Callable[..., Settings]
OK = {"memory_gb_over_limit": -1.0, "loss_drift_over_rtol": -1.0}
PROCESSES = 3  # one look: every process runs every member


def searched(study: optuna.Study, space: SearchSpace, knobs: dict[str, Any], step_s: float, **attrs: Any) -> None:
    config = TrialConfig.from_flat({**space.fixed, **knobs}, space.env, strict=False)
    ident = identity(config, space.env)
    study.add_trial(create_trial(state=TrialState.COMPLETE, values=[20.0 + 10_000 * step_s], params={}, user_attrs={
        "phase": "search", "config": config.active(space.env), "identity": ident, "name": str(knobs),
        "constraints": OK, "trial_dir": f"/nonexistent/{len(study.trials)}", **attrs,
        "result": {"status": "ok", "step_s": step_s, "compile_s": 20.0, "wall_s": 40.0, "fingerprint": ident,
                   "step_s_windows": [step_s] * 12}}))


def study_after_confirmation(settings: Settings) -> tuple[optuna.Study, SearchSpace, Any]:
    """A gpt2-tiny study whose search measured the three baselines, the compiled train step (the winner) and the
    train step in bf16; its side-by-side confirmation timed the winner beside eager, default compile and bf16 in
    every process."""
    space = SearchSpace(settings.env, settings.fixed_knobs)
    study = optuna.create_study(directions=["minimize"])
    searched(study, space, {"compile.scope": "none"}, 0.020, baseline="eager")
    searched(study, space, {"compile.scope": "module"}, 0.015, baseline="compile")
    searched(study, space, {"compile.scope": "regional"}, 0.016, baseline="regional")
    searched(study, space, {"compile.scope": "train_step"}, 0.010)
    searched(study, space, {"compile.scope": "train_step", "amp.dtype": "bfloat16"}, 0.011)
    study.set_user_attr("method.confirm", {"method": "side_by_side", "why": ""})
    for r in range(PROCESSES):
        for number in (3, 0, 1, 4):
            t = study.trials[number]
            study.add_trial(create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
                "phase": "confirm", "round": r, "label": f"#{number}", "candidate": number, "cold_trial": number,
                "method": "side_by_side", "constraints": OK, "config": t.user_attrs["config"],
                "result": {**t.user_attrs["result"], "compile_s": 2.0}}))
    return study, space, study.trials[3]


def test_the_runner_runs_the_plan_the_estimate_prices(settings_for: Compose) -> None:
    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu", f"compare.processes={PROCESSES}")
    study, space, winner = study_after_confirmation(settings)
    wanted = asked(winner, "auto", 0.0)[0]
    plan = verdict_side_plan(study, winner, space, wanted, PROCESSES)
    by_label = {n.cold.label: n for n in plan.neighbours}
    # Searched: eager, default compile, regional, bf16 (their search trials are their cold runs); eager, default
    # compile and bf16 were timed beside the winner in every confirmation process: they join no verdict process.
    assert {label for label, n in by_label.items() if n.beside} == {
        "compile.scope=none", "compile.scope=module", "amp.dtype=bfloat16"}
    runs_cold = {label for label, n in by_label.items() if n.runs_cold}
    assert "compile.scope=regional" not in runs_cold and runs_cold and all(
        label.startswith(("compile.mode", "optim.impl")) for label in runs_cold)
    assert {n.cold.label for n in plan.members()} == runs_cold | {"compile.scope=regional"}

    same = sorted(runs_cold)[0]  # its cold run compiles the winner's very program: it joins nothing
    ran: list[str] = []
    processes: list[set[str]] = []

    def measure(trial: optuna.Trial) -> None:
        rec = TrialRecord.of(trial)
        ran.append(rec.label or "")
        fingerprint = TrialRecord.of(winner).measured.fingerprint if rec.label == same else rec.label
        status = "same_program" if rec.label == same else "ok"
        set_attrs(trial, constraints=OK, trial_dir=f"/nonexistent/cold{trial.number}", result={
            "status": status, "step_s": 0.012 if status == "ok" else None, "compile_s": 25.0,
            "fingerprint": fingerprint, "step_s_windows": [0.012] * 12})
        study.tell(trial, [1.0] if status == "ok" else None,
                   state=TrialState.COMPLETE if status == "ok" else TrialState.PRUNED)

    def together(trials: list[optuna.Trial]) -> None:
        processes.append({TrialRecord.of(t).label or "" for t in trials})
        for t in trials:
            set_attrs(t, constraints=OK, result={"status": "ok", "step_s": 0.012, "compile_s": 25.0,
                                                 "step_s_windows": [0.012] * 12})
            study.tell(t, [1.0])

    phases = PhaseSettings(0, 3, PROCESSES, True, "auto", 0.0, "", settings.env, lambda members: None)
    assert verdicts_together(study, winner, space, wanted, phases, measure, together, Objective(settings.objective))
    assert sorted(ran) == sorted(runs_cold)  # the cold runs the estimate charged, no other
    after = verdict_side_plan(study, winner, space, wanted, PROCESSES)
    joined = {n.cold.label for n in after.members()}
    assert joined == runs_cold - {same} | {"compile.scope=regional"}
    assert processes == [joined | {"winner"}] * PROCESSES and after.processes_left() == 0
    assert not any(n.runs_cold for n in after.neighbours)


def test_before_the_search_the_foresight_stands_in_for_its_trials(settings_for: Compose) -> None:
    from autocompile.study.phase_costs import searched_foresight
    from autocompile.study.search.baselines import queue_baselines
    from autocompile.study.search.samplers import eager_runs_left

    settings = settings_for("+model=gpt2-tiny", "workload.device=cpu", "study.n_trials=10", "study.confirm_top=5")
    space = SearchSpace(settings.env, settings.fixed_knobs)
    study = optuna.create_study(directions=["minimize"])
    queue_baselines(study, space)
    config = TrialConfig.from_flat(space.start(**{"compile.scope": "train_step"}), space.env, strict=False)
    winner = create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={"config": config.active(space.env)})
    wanted = asked(winner, "auto", 0.0)[0]
    bare = verdict_side_plan(study, winner, space, wanted, 7, Foresight())
    assert all(n.runs_cold and n.joins for n in bare.neighbours)  # nothing measured, nothing timed beside it
    seen = searched_foresight(study, space, settings, winner)
    plan = verdict_side_plan(study, winner, space, wanted, 7, seen)
    scopes = {n.cold.label for n in plan.neighbours if n.cold.label.startswith("compile.scope")}
    # The staged search measures every lead scope, then one-knob changes of the compiled lead with its trials left
    # (10 less 4 leads less its eager runs); the confirmation races eager and default compile beside the winner.
    assert scopes and not any(n.runs_cold for n in plan.neighbours if n.cold.label in scopes)
    assert {"compile.scope=none", "compile.scope=module"} <= {n.cold.label for n in plan.neighbours if n.beside}
    assert len(plan.members()) < len(bare.members())
    compiled_runs = 10 - 4 - eager_runs_left(space, study.trials)
    assert sum(n.runs_cold for n in plan.neighbours) == len(plan.neighbours) - len(scopes) - compiled_runs
