"""MLflow nesting: the study's parent run has one child per configuration, its other trials nested under it.

A real in-memory Optuna study (search trials, a duplicate, repeats of the phases, a trial that failed before its
configuration was recorded) is logged with the real tracker to a SQLite store and read back with MlflowClient.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState, create_trial

from autocompile.report.tracking.nesting import PARENT_TAG, placement
from autocompile.report.tracking.runs import PARENT_ATTR, STUDY_TAG, TRIAL_TAG, MlflowTracker
from tests.test_tracking import tracked_settings

CONFIGS = {"eager": {"compile.scope": "none"}, "module": {"compile.scope": "module"},
           "regional": {"compile.scope": "regional"}}


def trial(identity: str | None, state: TrialState = TrialState.COMPLETE, **attrs: Any) -> optuna.trial.FrozenTrial:
    """A finished trial as the tuner records it (``identity`` None: it failed before its config was recorded)."""
    user_attrs: dict[str, Any] = {"phase": "search", **attrs}
    if identity is not None:
        user_attrs |= {"identity": identity, "config": CONFIGS[identity], "name": identity}
    if state == TrialState.COMPLETE:
        user_attrs["result"] = {"status": "ok", "step_s": 0.01, "compile_s": 1.0, "tokens_per_s": 1000.0,
                                "wall_s": 2.0}
        return create_trial(state=state, value=1.0, user_attrs=user_attrs)
    return create_trial(state=state, user_attrs={**user_attrs, "reason": "it broke"})


SEARCH = [trial("eager", baseline="eager"), trial("module"), trial(None, TrialState.FAIL), trial("regional"),
          trial("regional", duplicate_of=3)]
REPEATS = [trial("regional", phase="confirm", round=0, label="#3", candidate=3),
           trial("eager", phase="confirm", round=0, label="#0", candidate=0),
           trial("module", phase="verdict", round=-1, label="compile.scope=module", cold_run=True),
           trial("regional", phase="verdict", round=0, label="winner")]


def study_runs(tracker: MlflowTracker) -> dict[int, Any]:
    """Trial number -> its run, every run of the study at any depth (the parent left out)."""
    runs = tracker.client.search_runs([tracker.experiment_id], f"tags.`{STUDY_TAG}` = '{tracker.study.study_name}'",
                                      max_results=1000)
    numbered = [r for r in runs if TRIAL_TAG in r.data.tags]
    assert len(numbered) == len(runs) - 1  # the parent, and nothing else that is not a trial
    by_number = {int(r.data.tags[TRIAL_TAG]): r for r in numbered}
    assert len(by_number) == len(numbered)  # one run per trial, never two
    return by_number


def assert_nested_by_configuration(tracker: MlflowTracker) -> None:
    """The parent's direct children: one per identity (its first trial) and the trial without one; every other
    trial under its identity's first trial's run."""
    trials = tracker.study.get_trials()
    runs = study_runs(tracker)
    assert sorted(runs) == [t.number for t in trials]  # every trial logged once
    first: dict[str, int] = {}
    for t in trials:
        identity = t.user_attrs.get("identity")
        head = first.setdefault(identity, t.number) if identity else t.number
        expected = tracker.parent_id if head == t.number else runs[head].info.run_id
        assert runs[t.number].data.tags[PARENT_TAG] == expected, (t.number, t.user_attrs.get("phase"))
    direct = [n for n, r in runs.items() if r.data.tags[PARENT_TAG] == tracker.parent_id]
    assert sorted(direct) == sorted([*first.values(), *(t.number for t in trials if "identity" not in t.user_attrs)])


def new_study() -> optuna.Study:
    study = optuna.create_study(study_name="nested", direction="minimize")
    for t in SEARCH:
        study.add_trial(t)
    return study


def test_the_parent_has_one_child_per_configuration_and_its_repeats_nest_under_it(tmp_path: Path) -> None:
    settings = tracked_settings(tmp_path)
    study = new_study()
    tracker = MlflowTracker(settings, study, tmp_path / "run")  # logs the search trials finished so far
    for t in REPEATS:  # the phases' trials, logged one by one as they finish
        study.add_trial(t)
        tracker.log_trial(study.trials[-1])
    assert_nested_by_configuration(tracker)
    runs = study_runs(tracker)
    direct = {n for n, r in runs.items() if r.data.tags[PARENT_TAG] == tracker.parent_id}
    assert direct == {0, 1, 2, 3}  # eager, module, the failed trial without a configuration, regional
    assert {n for n, r in runs.items() if r.data.tags[PARENT_TAG] == runs[3].info.run_id} == {4, 5, 8}

    ids = {n: r.info.run_id for n, r in runs.items()}
    resumed = MlflowTracker(settings, study, tmp_path / "run")  # a resume: the tracker rebuilt, the runs there
    assert resumed.parent_id == tracker.parent_id
    assert {n: run_id for n, (run_id, _) in resumed.children.items()} == ids  # every run found, nested ones too
    assert {n: r.info.run_id for n, r in study_runs(resumed).items()} == ids  # and none logged again


def test_runs_logged_flat_or_out_of_order_are_moved_under_their_configuration(tmp_path: Path) -> None:
    settings = tracked_settings(tmp_path)
    study = new_study()
    tracker = MlflowTracker(settings, study, tmp_path / "run")
    for t in REPEATS:
        study.add_trial(t)
    tracker.sync()
    for run_id, _ in tracker.children.values():  # as a version that logged one flat child per trial left it
        tracker.client.set_tag(run_id, PARENT_TAG, tracker.parent_id)
    resumed = MlflowTracker(settings, study, tmp_path / "run")
    assert_nested_by_configuration(resumed)

    # A repeat logged before its configuration's first trial (another tuner logs that one) is moved under it.
    assert placement({5: "a", 9: "a", 7: None}, {9: "r9", 7: "r7"}, "p") == {7: "p", 9: "p"}
    assert placement({5: "a", 9: "a", 7: None}, {5: "r5", 9: "r9", 7: "r7"}, "p") == {5: "p", 7: "p", 9: "r5"}


def test_merging_parents_moves_configurations_and_their_nested_runs_follow(tmp_path: Path) -> None:
    settings = tracked_settings(tmp_path)
    study = new_study()
    here = MlflowTracker(settings, study, tmp_path / "here")
    for t in REPEATS:
        study.add_trial(t)
        here.log_trial(study.trials[-1])
    study.set_user_attr(PARENT_ATTR, "")  # another machine's tuner made a parent of its own and recorded it last
    there = MlflowTracker(settings, study, tmp_path / "there")
    assert there.parent_id != here.parent_id and there.children  # it logged the trials under its own parent
    here.converge()
    here.sync()
    assert here.parent_id == there.parent_id
    assert_nested_by_configuration(here)  # one run per trial (the second of each deleted), nested once more
