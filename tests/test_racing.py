"""The statistics of the confirmation and verdict phases, in-process: intervals, pairing by round,
the noise floor, the confirmed winner and the verdicts read from a study's repeats."""

from __future__ import annotations

import math
import random
import statistics
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState
from scipy.stats import t as student_t

from autocompile.config.settings import ObjectiveSettings, StudySettings
from autocompile.config.spec import MeasureSettings
from autocompile.study.phases.confirmation import INCUMBENT, confirmed
from autocompile.study.phases.racing import verdicts
from autocompile.study.records.objective import Objective
from autocompile.study.statistics.intervals import paired_ratio
from autocompile.study.statistics.noise import pooled_noise
from autocompile.trial.timing.stats import relative_half_width, t975


def test_tabulated_t_quantiles_agree_with_scipy() -> None:
    for df in (1, 2, 3, 5, 10, 29, 30, 31, 50, 200):
        assert t975(df) == pytest.approx(student_t.ppf(0.975, df), abs=2e-3)
    assert relative_half_width([1.0]) == math.inf
    assert relative_half_width([1.0, 1.0, 1.0]) == 0.0


def simulated_rounds(ratio: float, rounds: int, seed: int, drift: float = 0.5, noise: float = 0.05) -> tuple[
        dict[int, float], dict[int, float]]:
    """A machine whose speed drifts by up to ``drift`` between rounds (shared by both candidates in a
    round) with independent ``noise`` per run; B costs ``ratio`` x A."""
    rng = random.Random(seed)
    a, b = {}, {}
    for r in range(rounds):
        machine = math.exp(rng.uniform(-drift, drift))
        a[r] = 0.010 * machine * math.exp(rng.gauss(0, noise))
        b[r] = 0.010 * ratio * machine * math.exp(rng.gauss(0, noise))
    return a, b


def test_equal_cost_is_no_measurable_difference_even_under_drift() -> None:
    # Drift of +-50% between rounds would swamp an unpaired comparison; paired by round it cancels.
    a, b = simulated_rounds(1.0, rounds=5, seed=1)
    ratio = paired_ratio(b, a)
    assert not ratio.measurable and ratio.low < 0 < ratio.high
    assert ratio.high - ratio.low < 0.3  # the drift did not widen it: only the 5% per-run noise did
    assert "[95% CI" in ratio.text()


def test_a_certain_difference_is_measurable_and_its_interval_holds_the_truth() -> None:
    a, b = simulated_rounds(1.5, rounds=3, seed=2)
    ratio = paired_ratio(b, a)
    assert ratio.measurable and ratio.low > 0 and ratio.low < 0.5 < ratio.high
    assert paired_ratio(b, {}) is None
    one = paired_ratio({0: 2.0}, {0: 1.0})
    assert one.change == pytest.approx(1.0) and one.low is None and not one.measurable


def test_pooled_noise_is_the_relative_sd_across_processes() -> None:
    noise = pooled_noise([[1.0, 1.1, 0.9], [2.0, 2.0], [5.0]], "test")
    assert noise.df == 3  # 2 + 1; a configuration measured once adds nothing
    assert noise.rel_sd == pytest.approx(math.sqrt(sum((math.log(x) - m) ** 2 for x, m in zip(
        [1.0, 1.1, 0.9], [sum(map(math.log, [1.0, 1.1, 0.9])) / 3] * 3, strict=True)) / 3), rel=1e-9)
    assert pooled_noise([[1.0]], "test") is None


def test_settings_are_validated_with_the_fix_in_the_message() -> None:
    with pytest.raises(ValueError, match=r"measure\.precision"):
        MeasureSettings(precision=1.5)
    with pytest.raises(ValueError, match=r"measure\.max_timed_s"):
        MeasureSettings(max_timed_s=0)
    with pytest.raises(ValueError, match=r"compile\.backend"):
        StudySettings(verdicts=["compile.backend"])  # no question: not a verdict
    with pytest.raises(ValueError, match=r"study\.repeats"):
        StudySettings(repeats=0)
    assert StudySettings(verdicts=["amp.placement"]).verdict_knobs() == ["amp.placement"]
    assert StudySettings(verdicts="none").verdict_knobs() == []
    assert StudySettings().verdict_knobs() is None


def repeat(study: optuna.Study, phase: str, rnd: int, label: str, step_s: float | None, **attrs: Any) -> None:
    result = {"status": "ok", "step_s": step_s, "compile_s": 1.0} if step_s else {"status": "same_program"}
    study.add_trial(optuna.trial.create_trial(
        state=TrialState.COMPLETE if step_s else TrialState.PRUNED, values=[1.0] if step_s else None,
        user_attrs={"phase": phase, "round": rnd, "label": label, "result": result, "identity": label,
                    "constraints": {}, **attrs}))


def race_study(steps: dict[str, list[float]]) -> optuna.Study:
    study = optuna.create_study(directions=["minimize"])
    configs = {"eager": {"compile.scope": "none"}, "compile": {"compile.scope": "module"},
               "fancy": {"compile.scope": "regional", "compile.mode": "max-autotune-no-cudagraphs"}}
    for number, (label, values) in enumerate(steps.items()):
        for r, s in enumerate(values):
            repeat(study, "confirm", r, f"#{number}", s, candidate=number, config=configs[label], name=label,
                   baseline=label if label != "fancy" else None, compile_s_cold=0.0)
    return study


def test_the_confirmed_winner_is_the_simplest_of_those_that_tie_within_the_margin() -> None:
    throughput = Objective(ObjectiveSettings(kind="throughput"))  # objective.tie_margin: 2%
    # fancy is 0.5% faster in every round, an interval well within +-2%: a tie, the simpler compile wins.
    study = race_study({"eager": [0.030, 0.031, 0.029], "compile": [0.0200, 0.0210, 0.0195],
                        "fancy": [0.0199, 0.02089, 0.01941]})
    outcome = confirmed(study, throughput)
    assert outcome is not None and outcome.winner is not None
    assert outcome.leader == "#2" and set(outcome.tied_with_leader) == {"#1", "#2"}
    assert outcome.winner.name == "compile"  # the simplest of the tied
    assert outcome.decided and not outcome.undetermined
    assert {c.label: c.status for c in outcome.candidates}["#0"] == "slower"
    assert not outcome.beats_default_compile
    assert "nothing beats default torch.compile(model) beyond the noise" in outcome.conclusion
    assert "tie within +-2%" in outcome.conclusion
    step = outcome.gains["eager"].step
    assert step is not None and step.measurable and step.high is not None and step.high < 0

    clear = race_study({"eager": [0.030, 0.031, 0.029], "compile": [0.0200, 0.0210, 0.0195],
                        "fancy": [0.0150, 0.0158, 0.0147]})
    outcome = confirmed(clear, throughput)
    assert outcome is not None and outcome.winner is not None
    assert outcome.winner.name == "fancy" and outcome.beats_default_compile


def test_a_known_winner_reverified_is_kept_unless_a_candidate_is_measurably_faster() -> None:
    """study.reuse: the race's incumbent leads unless beaten beyond the noise; a lower mean inside it does not flip
    the recommendation (the mean rule recommends fancy here), a clearly faster program still does."""
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    configs = {"compile": {"compile.scope": "module"},
               "fancy": {"compile.scope": "regional", "compile.mode": "max-autotune-no-cudagraphs"}}

    def reverified(steps: dict[str, list[float]]) -> optuna.Study:
        study = optuna.create_study(directions=["minimize"])
        for label in steps:  # the search trials (numbers 0, 1), whose identities the race reads
            study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
                "phase": "search", "identity": f"id-{label}", "config": configs[label], "result": {"status": "ok"}}))
        for number, (label, values) in enumerate(steps.items()):
            for r, s in enumerate(values):
                repeat(study, "confirm", r, f"#{number}", s, candidate=number, config=configs[label], name=label,
                       baseline=label if label != "fancy" else None, compile_s_cold=0.0)
        study.set_user_attr(INCUMBENT, "id-compile")
        return study

    within = confirmed(reverified({"compile": [0.0200, 0.0210, 0.0195], "fancy": [0.0195, 0.0212, 0.0190]}),
                       throughput)
    assert within is not None and within.winner is not None
    assert within.winner.name == "compile" and within.leader == within.incumbent == "#0" and not within.decided
    assert "the known winner compile is kept" in within.conclusion and "fastest on average" not in within.conclusion
    assert {c.label: c.status for c in within.candidates}["#1"] == "undetermined"
    faster = confirmed(reverified({"compile": [0.0200, 0.0210, 0.0195], "fancy": [0.0150, 0.0158, 0.0147]}),
                       throughput)
    assert faster is not None and faster.winner is not None
    assert faster.winner.name == "fancy" and faster.incumbent == "#0" and "is kept" not in faster.conclusion


def test_an_interval_wider_than_the_margin_is_undetermined_and_the_best_mean_is_recommended() -> None:
    # Before: "the interval contains 0" read as a tie and the simpler compile was recommended.
    throughput = Objective(ObjectiveSettings(kind="throughput"))
    study = race_study({"compile": [0.0200, 0.0210, 0.0195], "fancy": [0.0195, 0.0212, 0.0190]})
    outcome = confirmed(study, throughput)
    assert outcome is not None and outcome.winner is not None
    assert outcome.winner.name == "fancy" and outcome.leader == "#1" and not outcome.decided
    (undetermined,) = outcome.undetermined
    assert undetermined.label == "#0" and undetermined.more_processes is not None and undetermined.more_processes > 0
    assert f"compare.processes={3 + undetermined.more_processes} would decide it" in outcome.conclusion
    assert outcome.as_dict()["undetermined"][0]["more_processes"] == undetermined.more_processes  # summary.json
    # A candidate without a round shared with the leader is no tie either.
    apart = optuna.create_study(directions=["minimize"])
    for number, (label, rnd, step) in enumerate((("compile", 0, 0.020), ("compile", 1, 0.021), ("fancy", 2, 0.019))):
        repeat(apart, "confirm", rnd, f"#{label}", step, candidate=number, config={"compile.scope": "module"},
               name=label, baseline=None, compile_s_cold=0.0)
    outcome = confirmed(apart, throughput)
    assert outcome is not None
    assert outcome.tied_with_leader == [outcome.leader] and outcome.undetermined[0].more_processes is None


def test_the_report_says_which_candidates_are_undetermined_and_what_would_decide_them() -> None:
    from rich.console import Console

    from autocompile.report.race_table import print_confirmed

    outcome = confirmed(race_study({"compile": [0.0200, 0.0210, 0.0195], "fancy": [0.0195, 0.0212, 0.0190]}),
                        Objective(ObjectiveSettings(kind="throughput")))
    console = Console(record=True, width=300)
    print_confirmed(console, outcome)
    text = console.export_text()
    assert outcome is not None
    more = outcome.undetermined[0].more_processes
    # Far more than the 3 it ran (issue 50): said as such, with the comparison that can run them.
    assert more is not None and more > 6
    assert f"undetermined (beyond this phase: over twice its 3 processes; task=compare of the two with " \
           f"compare.processes={3 + more} would decide it)" in " ".join(text.split())
    assert "every ± and [ ] is a 95% interval" in text and "prior 10.0% on 8 df" in text


def test_verdicts_come_from_the_rounds_of_the_winner_and_its_neighbours() -> None:
    study = optuna.create_study(directions=["minimize"])
    for r, (w, same_cost, slower) in enumerate([(0.020, 0.0202, 0.030), (0.024, 0.0238, 0.036),
                                                (0.021, 0.0211, 0.031)]):
        repeat(study, "verdict", r, "winner", w, compile_s_cold=1.0)
        repeat(study, "verdict", r, "amp.placement=inside", same_cost, knob="amp.placement", value="inside",
               reference="outside")
        repeat(study, "verdict", r, "amp.dtype=bfloat16", slower, knob="amp.dtype", value="bfloat16",
               reference="none")
    repeat(study, "verdict", 0, "placement.order=compile_then_to", None, knob="placement.order",
           value="compile_then_to", reference="to_then_compile", same_program_as=0)
    by_knob = {e.knob: e for e in verdicts(study)}
    assert not by_knob["amp.placement"].measurable
    assert "no measurable effect" in by_knob["amp.placement"].verdict
    assert "[95% CI" in by_knob["amp.placement"].verdict
    assert by_knob["amp.dtype"].measurable and by_knob["amp.dtype"].low > 0
    assert "measurably slower" in by_knob["amp.dtype"].verdict
    assert by_knob["placement.order"].identical and "identical program" in by_knob["placement.order"].verdict


def test_a_race_with_one_measured_candidate_confirms_nothing() -> None:
    outcome = confirmed(race_study({"compile": [0.02], "fancy": []}), Objective(ObjectiveSettings()))
    assert outcome is not None and outcome.winner is None and "no race" in outcome.reason
    assert outcome.as_dict()["winner"] is None and "no race" in outcome.as_dict()["reason"]


def test_phases_wait_until_no_other_tuner_of_the_study_measures_on_this_machine(tmp_path: Any) -> None:
    # Three tuners started together: repeats that are compared must not share the cores with the
    # other tuners' repeats (their phase lock) or their last search trials (a RUNNING trial).
    import fcntl
    import subprocess
    import sys
    import threading

    from autocompile.study.phases.repeats import PHASE_LOCK, alone_on_the_machine
    from autocompile.study.records.optuna_store import owner
    from autocompile.trial.launcher import Interrupted

    study = optuna.create_study()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        running = study.ask()
        study._storage.set_trial_user_attr(running._trial_id, "owner", {**owner(), "pid": other.pid})
        entered, stop = threading.Event(), threading.Event()

        def phases() -> None:
            with alone_on_the_machine(study, tmp_path, interrupt=stop, poll_s=0.02):
                entered.set()

        with open(tmp_path / PHASE_LOCK, "a") as held:  # another tuner runs its phases
            fcntl.flock(held, fcntl.LOCK_EX)
            waiter = threading.Thread(target=phases)
            waiter.start()
            assert not entered.wait(0.3)
        assert not entered.wait(0.3)  # the lock is free, but another live tuner's trial runs
        study.tell(running, 1.0)
        assert entered.wait(5)
        waiter.join()

        # A stop while waiting ends the wait at once.
        with open(tmp_path / PHASE_LOCK, "a") as held:
            fcntl.flock(held, fcntl.LOCK_EX)
            stop.set()
            with pytest.raises(Interrupted), alone_on_the_machine(study, tmp_path, interrupt=stop, poll_s=0.02):
                pass
    finally:
        other.kill()
        other.wait()


def test_a_verdict_says_peak_memory_beside_step_time() -> None:
    """Issue 37: a checkpointing or memory-budget neighbour's verdict weighs both: its step time and its peak
    memory against the winner's (cold runs alone, one each)."""
    from autocompile.study.statistics.effect import Effect

    effect = Effect("ac.policy", "q", "none", "budget_0.5", 0.04, 0.01, 1.0, 5, True, basis="verdict", low=0.03,
                    high=0.05, memory_change=-0.31)
    assert "step time +4.0% [95% CI +3.0, +5.0], measurably slower" in effect.verdict
    assert "peak memory -31%" in effect.verdict and effect.as_dict()["memory_change"] == -0.31


def test_a_neighbour_the_search_measured_takes_that_trial_as_its_cold_run() -> None:
    from autocompile.study.phases.plans import Slot
    from autocompile.study.phases.racing import compile_spread
    from autocompile.study.phases.repeats import slot_done
    from autocompile.study.phases.run import reuse_search_runs

    study = optuna.create_study(directions=["minimize"])
    study.set_user_attr("method.verdict", {"method": "side_by_side", "why": ""})

    def search(identity: str, fingerprint: str, state: TrialState = TrialState.COMPLETE, **more: Any) -> None:
        study.add_trial(optuna.trial.create_trial(state=state, values=[2.0] if state == TrialState.COMPLETE else None,
                                                  user_attrs={
            "phase": "search", "identity": identity, "constraints": {}, "trial_dir": f"/runs/{identity}",
            "config": {"compile.scope": "module"}, "result": {"status": "ok", "step_s": 0.01, "compile_s": 20.0,
                                                              "fingerprint": fingerprint}, **more}))

    search("winner", "W")  # 0
    search("mode=max-autotune", "M")  # 1: measured, a distinct program
    search("fullgraph=true", "W")  # 2: measured, the winner's very program
    search("dynamic=true", "D", TrialState.PRUNED)  # 3: one window only: its own cold run
    search("options=on", "O", constraints={"memory_gb_over_limit": 1.0})  # 4: infeasible: its own cold run
    labels = ["compile.mode=max-autotune", "compile.fullgraph=true", "compile.dynamic=true", "compile.options=on",
              "compile.granularity=sublayer"]
    cold = [Slot("verdict", -1, label, {}, {"cold_run": True, "knob": label.split("=")[0], "value": "x"})
            for label in labels]
    identities = ["mode=max-autotune", "fullgraph=true", "dynamic=true", "options=on", "never searched"]
    spread = compile_spread(study, ObjectiveSettings())  # W compiled cold twice (trials 0 and 2): 1 df
    assert reuse_search_runs(study, study.trials[0], cold, identities) == 2
    assert [slot_done(study, slot.key()) for slot in cold] == [True, True, False, False, False]
    by_label = {t.user_attrs["label"]: t for t in study.trials if t.user_attrs.get("phase") == "verdict"}
    mode, full = by_label["compile.mode=max-autotune"], by_label["compile.fullgraph=true"]
    assert mode.user_attrs["cold_from"] == 1 and mode.user_attrs["trial_dir"] == "/runs/mode=max-autotune"
    assert mode.user_attrs["cold_run"] and mode.user_attrs["round"] == -1 and "same_program_as" not in mode.user_attrs
    assert full.user_attrs["same_program_as"] == 0  # the winner's fingerprint: "identical program"
    # Run again (a resumed phase): nothing is copied twice.
    assert reuse_search_runs(study, study.trials[0], cold, identities) == 0
    # One compile, not two: a copy never enters the compile spread as a second cold compile of its program.
    assert compile_spread(study, ObjectiveSettings()) == spread and spread.measured_df == 1


def test_auto_verdicts_ask_checkpointing_only_where_memory_binds() -> None:
    """``study.verdicts=auto`` (the default): activation checkpointing buys memory with step time, so at a winner
    that does not checkpoint and with no memory limit it cannot change the recommendation and is not asked; the
    report lists it with why. A memory limit, or a winner that checkpoints, asks it; ``all`` always does."""
    from autocompile.study.phases.plans import asked
    from autocompile.study.records.optuna_store import NOT_ASKED

    study = optuna.create_study()
    plain = optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0],
                                      user_attrs={"config": {"compile.scope": "module", "ac.policy": "none"}})
    wanted, left = asked(plain, "auto", 0.0)
    assert wanted is not None and "ac.policy" not in wanted and "compile.mode" in wanted and "ac.policy" in left
    assert "ac.policy" in asked(plain, "auto", 8.0)[0]  # type: ignore[operator]
    block = optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0],
                                      user_attrs={"config": {"compile.scope": "module", "ac.policy": "block"}})
    assert "ac.policy" in asked(block, "auto", 0.0)[0]  # type: ignore[operator]
    assert asked(plain, "all", 0.0) == (None, {}) and asked(plain, "none", 0.0) == ([], {})
    assert asked(plain, ["amp.dtype"], 0.0) == (["amp.dtype"], {})
    # The report: a not-asked row beside the measured verdicts, never measurable, saying why.
    repeat(study, "verdict", 0, "winner", 0.010, config={"compile.scope": "module", "ac.policy": "none"})
    repeat(study, "verdict", 1, "winner", 0.010, config={"compile.scope": "module", "ac.policy": "none"})
    for r, s in enumerate([0.013, 0.013]):
        repeat(study, "verdict", r, "amp.dtype=bfloat16", s, knob="amp.dtype", value="bfloat16", reference="none",
               config={"compile.scope": "module", "amp.dtype": "bfloat16"})
    study.set_user_attr(NOT_ASKED, left)
    found = {e.knob: e for e in verdicts(study)}
    assert set(found) == {"amp.dtype", "ac.policy"}
    assert not found["ac.policy"].measurable and "not asked" in found["ac.policy"].verdict
    assert "memory_limit_gb" in found["ac.policy"].verdict and found["amp.dtype"].family == 1


def test_a_neighbour_the_confirmation_timed_beside_the_winner_reads_those_processes() -> None:
    """Issue 35: a verdict neighbour whose configuration the confirmation raced beside the winner in every one of
    its side-by-side processes (eager and default compile always are) joins no verdict process: its verdict pairs
    the confirmation's windows, the winner's from the same processes, and it is read once, at the end."""
    from autocompile.study.phases.phase_plan import raced, timed_beside
    from autocompile.study.records.optuna_store import VERDICT_LOOK

    rng = random.Random(3)
    study = optuna.create_study(directions=["minimize"])
    for scope, baseline in [("train_step", None), ("none", "eager")]:
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
            "phase": "search", "identity": f"scope={scope}", "baseline": baseline, "constraints": {},
            "config": {"compile.scope": scope}, "result": {"status": "ok", "step_s": 0.01, "compile_s": 20.0}}))
    study.set_user_attr("method.confirm", {"method": "side_by_side", "why": ""})
    study.set_user_attr("method.verdict", {"method": "side_by_side", "why": ""})

    def windows(ms: float) -> list[float]:
        return [ms / 1000 * math.exp(rng.gauss(0, 0.03)) for _ in range(12)]

    def timed(phase: str, r: int, label: str, ms: float, **attrs: Any) -> None:
        w = windows(ms)
        study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
            "phase": phase, "round": r, "label": label, "method": "side_by_side", "constraints": {},
            "result": {"status": "ok", "step_s": math.exp(statistics.fmean(map(math.log, w))), "step_s_windows": w,
                       "compile_s": 2.0}, **attrs}))

    for r in range(4):  # the confirmation: the winner (#0) and eager (#1) side by side, eager 30 % slower
        timed("confirm", r, "#0", 10.0, candidate=0, compile_s_cold=20.0, cold_trial=0,
              config={"compile.scope": "train_step"})
        timed("confirm", r, "#1", 13.0, candidate=1, compile_s_cold=0.0, cold_trial=1, config={"compile.scope": "none"})
    assert timed_beside(study, study.trials[0], 4) == {"scope=none": "#1"}
    assert timed_beside(study, study.trials[0], 5) == {}  # fewer processes than the verdicts would run
    assert raced(study) == {"scope=none"}
    # The verdict phase: eager's cold run is its search trial, marked timed in the confirmation; bf16 runs in the
    # verdict's own processes beside the winner, 5 % slower.
    cold = {"cold_run": True, "round": -1, "phase": "verdict", "same_as_trial": 0, "constraints": {},
            "method": "side_by_side"}
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
        **cold, "label": "compile.scope=none", "knob": "compile.scope", "value": "none", "reference": "train_step",
        "timed_in": "#1", "cold_from": 1, "config": {"compile.scope": "none"},
        "result": {"status": "ok", "step_s": 0.013, "compile_s": 0.0}}))
    study.add_trial(optuna.trial.create_trial(state=TrialState.COMPLETE, values=[1.0], user_attrs={
        **cold, "label": "amp.dtype=bfloat16", "knob": "amp.dtype", "value": "bfloat16", "reference": "none",
        "config": {"compile.scope": "train_step", "amp.dtype": "bfloat16"},
        "result": {"status": "ok", "step_s": 0.0105, "compile_s": 21.0}}))
    for r in range(4):
        timed("verdict", r, "winner", 14.0, candidate=0, compile_s_cold=20.0, cold_trial=0,
              config={"compile.scope": "train_step"})  # another speed of the machine than the confirmation's
        timed("verdict", r, "amp.dtype=bfloat16", 14.7, knob="amp.dtype", value="bfloat16", reference="none",
              config={"compile.scope": "train_step", "amp.dtype": "bfloat16"})
    objective = Objective(ObjectiveSettings())
    found = {e.knob: e for e in verdicts(study, objective)}
    eager, amp = found["compile.scope"], found["amp.dtype"]
    # Paired with the winner's windows of the confirmation's processes (+30 %), not with the verdict's (14 ms).
    assert eager.step_change == pytest.approx(0.30, abs=0.03) and eager.family_measurable
    assert "side by side in the confirmation's 4 processes" in eager.how
    assert amp.step_change == pytest.approx(0.05, abs=0.02) and "side by side in 4 processes" in amp.how
    assert eager.family == amp.family == 2  # one family: Holm over both
    # Time to train against the winner from the same processes: 10 000 steps of 13 ms vs 20 s + 10 000 of 10 ms.
    assert eager.score_change == pytest.approx(130 / 120 - 1, abs=0.02)
    # Read at two looks, it is read once, at the end (the first look stops only what the verdict processes time).
    study.set_user_attr(VERDICT_LOOK, 2)
    found = {e.knob: e for e in verdicts(study, objective)}
    assert found["compile.scope"].look == 2 and found["compile.scope"].step_change == pytest.approx(eager.step_change)
