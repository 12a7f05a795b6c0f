"""Studies on what a trial ran: one program measured once with the verdict "identical program", and
a numerics check that stays on whatever the study fixes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from autocompile.study.records.record import Measurement, set_attrs
from autocompile.study.search.tell import Twin, same_program_run, settled
from autocompile.study.search.twins import search_twins
from autocompile.trial.launcher import INTERRUPT, Interrupted
from tests.test_tuner import tune_cli

# Everything fixed but what a test searches: the enqueued trials are the study's whole space.
FIXED = ["compile.backend=aot_eager", "compile.fullgraph=false", "compile.optimizer=false",
         "compile.compiled_autograd=false", "ac.policy=none"]


def study_with(tmp_path: Path, *params: dict[str, Any]) -> optuna.Study:
    """The study the command below opens (study.name=t), with ``params`` queued first."""
    (tmp_path / "t").mkdir(parents=True)
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "t" / "optuna.journal")))
    study = optuna.create_study(study_name="t", storage=storage, directions=["minimize"])
    for p in params:
        study.enqueue_trial(p)
    return study


def reload(tmp_path: Path) -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(tmp_path / "t" / "optuna.journal")))
    return optuna.load_study(study_name="t", storage=storage)


@pytest.mark.parametrize("status", ["same_program", "ok"])
def test_a_run_of_a_measured_program_is_its_twin_whether_stopped_or_finished_before_the_poll(status: str) -> None:
    # The CI of 168cbd5 failed on a second trial that finished before a poll read its compile: it was timed
    # again and its knob got no "identical program" verdict. Stopped or finished, the program decides.
    twin = Twin(0, "the same program as trial 0 (module)")

    def twin_of(fp: str) -> Twin | None:
        return twin if fp == "abc" else None

    measured, found = same_program_run(Measurement(status=status, fingerprint="abc", reason="r"), twin_of)
    assert found is twin and measured.status == "same_program" and measured.fingerprint == "abc"
    other, none = same_program_run(Measurement(status=status, fingerprint="xyz"), twin_of)
    assert none is None and other.status == status  # another program: measured as it ran
    failed, no_twin = same_program_run(Measurement(status="failed", fingerprint="abc"), lambda fp: twin)
    assert no_twin is None and failed.status == "failed"  # a failure is data of its own, never its twin's
    assert same_program_run(Measurement(status="ok", fingerprint="abc"), None)[1] is None  # no twin looked for
    # Stopped for a twin that has ended otherwise since: the stop was for that one, whatever a new look finds.
    stopped = Measurement(status="same_program", fingerprint="abc", reason="r")
    assert same_program_run(stopped, lambda fp: None, twin)[1] is twin
    # Finished with a measurement of its own while its twin still runs: it keeps it (the twin will find it).
    running = Twin(5, "the same program as trial 5", pending=lambda: None)
    kept, none = same_program_run(Measurement(status="ok", fingerprint="abc"), lambda fp: running)
    assert none is None and kept.status == "ok"


def test_a_trial_waiting_for_its_programs_twin_takes_its_end_or_is_queued_again() -> None:
    study = optuna.create_study(directions=["minimize"])
    first, waiter = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])}), study.ask()
    set_attrs(first, result=Measurement(status="ok", fingerprint="abc"))
    study.tell(first, [1.0])
    ended = study.trials[first.number]
    stopped = Measurement(status="same_program", fingerprint="abc", reason="r")
    found = settled(study, waiter, Twin(first.number, "w", pending=lambda: ended), stopped)
    assert found is not None and found.stands_for is ended  # complete, pruned or failed: its end stands
    # It had not ended after the patience: nothing measured the program for the waiter, which is queued again.
    lost = study.ask({"x": optuna.distributions.CategoricalDistribution(["a", "b"])})
    assert settled(study, lost, Twin(first.number, "w", pending=lambda: None), stopped) is None
    frozen = study.trials[lost.number]
    assert frozen.state == TrialState.FAIL and frozen.user_attrs["interrupted"]
    (retry,) = study.get_trials(states=(TrialState.WAITING,))
    assert retry.system_attrs["fixed_params"] == frozen.params and retry.user_attrs["retry_of"] == lost.number
    # The tuner stopping meanwhile: the waiter is released as an interrupted trial is.
    INTERRUPT.set()
    try:
        with pytest.raises(Interrupted):
            settled(study, study.ask(), Twin(first.number, "w", pending=lambda: None), stopped)
    finally:
        INTERRUPT.clear()


def test_trials_in_flight_that_compile_one_program_measure_it_once(tmp_path: Path) -> None:
    # CI of cf15679: two trials of one program begun together (two in flight) were both timed, neither the twin of
    # the other. The first to report its compile claims the program; the later one waits for it.
    study = optuna.create_study(directions=["minimize"])
    first, second, base = study.ask(), study.ask(), study.ask()
    beats: list[int] = []
    find_first = search_twins(study, first, tmp_path, 5.0, lambda: beats.append(0))
    find_second = search_twins(study, second, tmp_path, 5.0, lambda: beats.append(1))
    find_base = search_twins(study, base, tmp_path, 5.0, lambda: None, measured_anyway=True)
    assert find_first("abc") is None and first.user_attrs["program"] == "abc"  # claimed: measured here
    assert find_first("abc") is None  # and again at its end
    waiting = find_second("abc")
    assert waiting is not None and waiting.number == first.number and waiting.stands_for is None
    assert find_base("abc") is None  # a baseline is measured whatever it compiles
    assert find_second("xyz") is None and second.user_attrs["program"] == "xyz"  # another program: its own
    set_attrs(first, result=Measurement(status="ok", fingerprint="abc"))
    study.tell(first, [1.0])
    assert waiting.pending is not None
    ended = waiting.pending()
    assert ended is not None and ended.number == first.number and ended.state == TrialState.COMPLETE
    measured = search_twins(study, study.ask(), tmp_path, 5.0, lambda: None)("abc")
    assert measured is not None and measured.stands_for is not None and measured.stands_for.number == first.number
    third = study.ask()
    late = search_twins(study, third, tmp_path, 0.0, lambda: None)
    assert late("xyz") is not None and late("xyz").pending() is None  # type: ignore[union-attr]  # still running


@pytest.mark.integration
@pytest.mark.parametrize(("knob", "values", "fixed"), [
    ("placement.order", ["to_then_compile", "compile_then_to"], ["amp.dtype=none"]),
    ("amp.placement", ["outside", "inside"], ["amp.dtype=bfloat16", "placement.order=to_then_compile"]),
])
def test_one_program_is_measured_once_and_its_knob_gets_the_verdict_identical(
        tmp_path: Path, knob: str, values: list[str], fixed: list[str]) -> None:
    study_with(tmp_path, *({knob: v} for v in values))
    # Two in flight (on any number of cores): both compile the one program at nearly the same moment.
    done = tune_cli(tmp_path, "study.name=t", "study.n_trials=2", "study.baselines=false", "compile.scope=module",
                    "launch.concurrency=2", *FIXED, *fixed)
    assert done.returncode == 0, done.stderr[-2000:]
    trials = reload(tmp_path).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2
    # Two in flight, either may compile first: the other is stopped once compiled and not timed again.
    (second,) = [t for t in trials if "same_program_as" in t.user_attrs]
    (first,) = [t for t in trials if t.number == second.user_attrs["same_program_as"]]
    assert "same_program_as" not in first.user_attrs
    result = json.loads(Path(second.user_attrs["trial_dir"], "result.json").read_text())
    # Stopped once compiled, or (this model's timed part can be shorter than the launcher's poll) run to its end.
    assert result["status"] in ("same_program", "ok")
    assert result["fingerprint"] == first.user_attrs["result"]["fingerprint"]
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    (effect,) = [e for e in summary["effects"] if e["knob"] == knob]
    assert effect["identical"] and "identical program" in effect["verdict"]
    assert summary["counts"]["same_program"] == 1


@pytest.mark.integration
@pytest.mark.parametrize("setup", ["fixed_scope", "no_baselines"])
def test_numerics_are_checked_with_a_fixed_scope_and_without_baselines(tmp_path: Path, setup: str) -> None:
    # Compiled, this model computes a step that does not train; eager, it learns (lr 0.05).
    model = ["model._target_=tests.models.tiny_lm", "+model.behaviour=frozen_when_compiled",
             "workload.optimizer.lr=0.05", "measure.windows=3", "measure.window_steps=3"]
    if setup == "fixed_scope":
        study_with(tmp_path)
        args = ["compile.scope=module", "study.n_trials=1"]
    else:
        study_with(tmp_path, {"compile.scope": "module"})
        args = ["study.baselines=false", "study.n_trials=1"]
    done = tune_cli(tmp_path, "study.name=t", *model, *FIXED, "amp.dtype=none", "placement.order=to_then_compile",
                    *args)
    assert done.returncode == 0, done.stderr[-2000:]
    study = reload(tmp_path)
    assert study.user_attrs["reference"]["status"] == "ok"  # the eager reference ran although no trial is eager
    (trial,) = [t for t in study.trials if t.user_attrs.get("config", {}).get("compile.scope") == "module"]
    assert trial.user_attrs["numerics"] == "checked"
    assert trial.user_attrs["constraints"]["loss_drift_over_rtol"] > 0  # caught: infeasible
    summary = json.loads((tmp_path / "t" / "summary.json").read_text())
    assert summary["best"] is None and summary["counts"]["infeasible"] == 1
