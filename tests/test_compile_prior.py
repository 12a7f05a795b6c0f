"""What the time-to-train intervals and the confirmation rest on (issue 50): the compile spread's prior per device
class, learned from the earlier studies under ``output_root``, fixed in the study; the best of each scope the search
cannot rule out raced in the confirmation."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autocompile.config.sections import ObjectiveSettings
from autocompile.study.phases.plans import confirm_plan, open_scopes, ranked_trials
from autocompile.study.records.compile_prior import (
    MAX_LEARNED_DF,
    PRIOR_KEY,
    class_prior,
    learned_prior,
    record_prior,
    study_prior,
)
from autocompile.study.records.objective import Objective
from autocompile.study.statistics.intervals import CompileSpread


def summary(root: Path, name: str, cv: float | None, df: float, device: str = "cpu-x") -> None:
    (root / name).mkdir(parents=True)
    spread = {"cv": 0.1, "df": 9, "source": "s", "measured_cv": cv, "measured_df": df, "device": device}
    (root / name / "summary.json").write_text(json.dumps({"confirmed": {"compile_spread": spread}}))


def test_the_prior_is_the_device_classs_unless_given() -> None:
    assert (class_prior("cpu", ObjectiveSettings()).cv, class_prior("cpu", ObjectiveSettings()).df) == (0.10, 8)
    cuda = class_prior("cuda", ObjectiveSettings())
    assert (cuda.cv, cuda.df) == (0.10, 2) and "H200" in cuda.source
    given = class_prior("cuda", ObjectiveSettings(compile_cv=0.04, compile_df=6))
    assert (given.cv, given.df) == (0.04, 6) and "objective.compile_cv" in given.source


def test_earlier_studies_on_this_device_teach_the_prior_and_a_bad_record_is_skipped(tmp_path: Path) -> None:
    base = CompileSpread(0.10, 8, "prior 10.0% on 8 df (class)", device="cpu-x")
    summary(tmp_path, "a", 0.20, 2)
    summary(tmp_path, "b", 0.50, 3, device="another machine")  # not this device: not learned
    summary(tmp_path, "c", None, 0)  # compiled nothing cold twice
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "summary.json").write_text('{"confirmed": {"compile_spr')  # half-written
    prior = learned_prior(base, tmp_path, "cpu-x")
    assert prior.df == 10 and abs(prior.cv**2 - (8 * 0.01 + 2 * 0.04) / 10) < 1e-12
    assert "1 earlier study on this device" in prior.source
    # Once the machine's own record weighs as much as the class prior, it is the prior alone (capped).
    for k in range(8):
        summary(tmp_path, f"more{k}", 0.20, 2)
    alone = learned_prior(base, tmp_path, "cpu-x")
    assert (round(alone.cv, 9), alone.df) == (0.20, MAX_LEARNED_DF) and "set aside" in alone.source
    # Its own run directory is never its own prior.
    only = tmp_path / "only"
    summary(only, "self", 0.30, 4)
    assert learned_prior(base, only, "cpu-x", run_dir=only / "self") == base


def test_a_study_keeps_the_prior_it_started_with() -> None:
    study = optuna.create_study()
    assert study_prior(study, ObjectiveSettings()).cv == 0.10  # a study from before priors were kept: the CPU's
    record_prior(study, CompileSpread(0.07, 5, "first", device="d"))
    record_prior(study, CompileSpread(0.30, 9, "later"))  # a resumed study: the first stays
    assert study.user_attrs[PRIOR_KEY]["cv"] == 0.07 and study_prior(study, ObjectiveSettings()).df == 5


def search_study(trials: list[tuple[str, float, float]]) -> optuna.Study:
    study = optuna.create_study()
    for scope, step, compile_s in trials:
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
            "phase": "search", "config": {"compile.scope": scope}, "identity": f"{scope}-{step}",
            "result": {"status": "ok", "step_s": step, "compile_s": compile_s, "fingerprint": f"{scope}-{step}"}}))
    return study


def test_the_confirmation_races_the_best_of_each_scope_the_search_cannot_rule_out() -> None:
    # Seed 0 of issue 50: the train step's one process ran 15 % slow and missed the top 2; it is raced all the
    # same. A scope 3x slower is ruled out beyond the noise and stays out.
    objective = Objective(ObjectiveSettings())
    study = search_study([("none", 0.0200, 0.0), ("module", 0.0195, 20.0), ("module", 0.0196, 21.0),
                          ("train_step", 0.0225, 25.0), ("regional", 0.060, 20.0)])
    ranked = ranked_trials(study, objective)
    scopes = [rec.config["compile.scope"] for _, rec in open_scopes(study, objective, ranked)]
    assert "train_step" in scopes and "regional" not in scopes
    raced = [study.trials[slot.attrs["candidate"]].user_attrs["config"]["compile.scope"]
             for slot in confirm_plan(study, objective, top=2, repeats=1)]
    assert sorted(raced) == ["module", "none", "train_step"]  # the top 2 (eager, module), and the train step
