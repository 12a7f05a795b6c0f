"""What the repeats say: the study's noise floor, the confirmed winner, and a verdict per question.

Pure functions of the study's trials, so a resumed study, the report and MLflow read the same
answer. Every repeat is a trial with user attributes ``phase`` (``confirm`` / ``verdict``),
``round`` and ``label`` (the candidate or neighbour it measures). Within a round the candidates
ran back to back, so a round's ratio of step times cancels the machine's drift; a difference is
"measurable" only when the 95% interval of the mean log-ratio over rounds excludes zero.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from optuna import Study
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.knobs import KNOBS, Env
from autocompile.study.effect import Effect
from autocompile.study.intervals import Paired, break_even, paired_windows, time_to_train
from autocompile.study.objective import Objective
from autocompile.study.objective import time_to_train as time_to_train_s
from autocompile.study.record import TrialRecord
from autocompile.study.shared import feasible, interrupted, measured_trials
from autocompile.study.together import method
from autocompile.trial.stats import Noise, Ratio, paired_ratio, pooled_noise

REPEAT_PHASES = ("confirm", "verdict")


def phase(trial: FrozenTrial) -> str:
    return TrialRecord.of(trial).phase


def phase_trials(study: Study, name: str) -> list[FrozenTrial]:
    """Finished repeats of one phase that were not interrupted (an interrupted one is measured again), of
    the method the phase runs by (a phase that fell back from side by side leaves those trials aside)."""
    how = method(study, name)["method"]
    return [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED,
                                                                 TrialState.FAIL))
            if (rec := TrialRecord.of(t)).phase == name and not interrupted(t) and rec.method == how]


def step_time(trial: FrozenTrial) -> float | None:
    """A repeat's step time when it measured one and passed the numerics and memory checks."""
    result = TrialRecord.of(trial).measured
    if trial.state != TrialState.COMPLETE or not result.ok or not feasible(trial):
        return None
    return result.step_s


def simplicity(config: dict[str, Any]) -> tuple[int, int]:
    """Eager first (nothing to apply), then the fewest knobs changed from torch.compile's defaults."""
    changed = sum(1 for k, v in config.items() if k in KNOBS and v != KNOBS[k][1])
    return (0 if config.get("compile.scope") == "none" else 1, changed)


def study_noise(study: Study, env: Env) -> Noise | None:
    """Run-to-run noise of step time: one program measured in several fresh processes under one set of
    measurement settings, pooled. A program's repeats alone in a process (search retries, fresh-process
    rounds) form one group, its side-by-side rounds another; the numerics reference never joins (it ran
    at another time and is no repeat), nor a verdict neighbour's single cold run."""
    groups: dict[tuple[str, str], list[float]] = {}
    for t in [*measured_trials(study), *phase_trials(study, "confirm"), *phase_trials(study, "verdict")]:
        step = step_time(t)
        rec = TrialRecord.of(t)
        if step is not None and rec.same_program_as is None and not rec.cold_run:
            how = rec.method if not rec.is_search else "fresh_processes"
            groups.setdefault((rec.identity, how), []).append(step)
    repeated = {k: v for k, v in groups.items() if len(v) > 1}
    kinds = sorted({"side by side" if how == "side_by_side" else "alone" for _, how in repeated})
    return pooled_noise(list(repeated.values()),
                        f"{len(repeated)} configuration(s) measured in several fresh processes "
                        f"({' and '.join(kinds) or 'none'}), {sum(map(len, repeated.values()))} measurements; "
                        "the numerics reference is not pooled")


@dataclass
class Candidate:
    """A configuration raced in the confirmation phase (a search trial's program)."""

    label: str
    number: int
    name: str
    config: dict[str, Any]
    baseline: str | None
    compile_s: float
    """Cold compile seconds, from its search trial (repeats may reuse its warm cache)."""
    steps: dict[int, float] = field(default_factory=dict)
    """Round -> step seconds of its repeats."""
    windows: dict[int, list[float]] = field(default_factory=dict)
    """Side by side: round (process) -> its window step times, aligned with the other candidates'."""

    def scores(self, objective: Objective) -> dict[int, float]:
        """Per round, lower is better: step time (throughput) or time to train with the cold compile time
        (time_to_train, and pareto, which has no single score)."""
        if objective.kind == "throughput":
            return dict(self.steps)
        horizon = objective.settings.horizon_steps
        return {r: time_to_train_s(self.compile_s, s, horizon) for r, s in self.steps.items()}

    def step_s(self) -> float:
        return math.exp(statistics.fmean(map(math.log, self.steps.values())))

    def summary(self) -> dict[str, Any]:
        steps = list(self.steps.values())
        return {"label": self.label, "trial": self.number, "name": self.name, "config": self.config,
                "baseline": self.baseline, "compile_s_cold": self.compile_s, "rounds": len(steps),
                "step_s_geomean": math.exp(statistics.fmean(map(math.log, steps))) if steps else None,
                "step_s_rounds": {str(r): s for r, s in sorted(self.steps.items())},
                "windows": sum(map(len, self.windows.values()))}


def versus(a: Candidate, b: Candidate, objective: Objective, score: bool) -> Ratio | None:
    """``a / b``: of step time, or (``score``) of the objective's score. Side by side, windows are paired
    within processes and the cold compiles carried in (``objective.compile_cv``); otherwise rounds are
    paired, each a fresh process per candidate."""
    if a.windows and b.windows:
        step = paired_windows(b.windows, a.windows)
        if step is None or not score or objective.kind == "throughput":
            return step
        return time_to_train(step, (b.step_s(), b.compile_s), (a.step_s(), a.compile_s),
                             objective.settings.horizon_steps, objective.settings.compile_cv)
    return paired_ratio(a.scores(objective), b.scores(objective)) if score else paired_ratio(a.steps, b.steps)


def confirmed(study: Study, objective: Objective) -> dict[str, Any] | None:
    """The confirmation phase's answer; None when it did not run.

    The leader has the best mean score over rounds; every candidate whose paired interval against
    the leader includes zero ties with it, and the simplest of the tied is the winner. Gains over
    eager and default compile are paired intervals of step time (winner / baseline - 1; negative =
    the winner is faster) and of the objective's score (cold compile + horizon steps).
    """
    trials = phase_trials(study, "confirm")
    if not trials:
        return None
    candidates: dict[str, Candidate] = {}
    for t in trials:
        a = TrialRecord.of(t)
        c = candidates.setdefault(a.label, Candidate(a.label, a.candidate, a.name, a.config, a.baseline,
                                                     a.compile_s_cold))
        if (step := step_time(t)) is not None:
            c.steps[a.round] = step
            if a.method == "side_by_side":
                c.windows[a.round] = a.measured.step_s_windows
    measured = [c for c in candidates.values() if c.steps]
    if len(measured) < 2:  # an interrupted phase, or every other candidate failed: nothing was raced
        return {"winner": None, "reason": f"{len(measured)} candidate(s) with a completed repeat: no race (an "
                                          "interrupted phase resumes when the same command runs again)",
                "candidates": [c.summary() for c in candidates.values()]}

    def mean_score(c: Candidate) -> float:
        return statistics.fmean(math.log(s) for s in c.scores(objective).values())

    leader = min(measured, key=mean_score)
    versus_leader: dict[str, Ratio | None] = {c.label: versus(c, leader, objective, score=True) for c in measured}
    ties = [c for c in measured if c is leader or not (r := versus_leader[c.label]) or not r.measurable
            or r.change < 0]
    winner = min(ties, key=lambda c: (simplicity(c.config), mean_score(c)))
    gains = {}
    for c in measured:
        if c.baseline in ("eager", "compile") and c is not winner:
            step = versus(winner, c, objective, score=False)
            score = versus(winner, c, objective, score=True)
            gains[c.baseline] = {"step": step.as_dict() if step else None, "score": score.as_dict() if score else None,
                                 "text": step.text() if step else "no shared round"}
    compile_base = next((c for c in measured if c.baseline == "compile"), None)
    beats_compile = compile_base is not None and compile_base is not winner and (
        (g := gains.get("compile")) is not None and g["score"] is not None and g["score"]["measurable"]
        and g["score"]["change"] < 0)
    return {
        "winner": winner.summary(), "leader": leader.label,
        "tied_with_leader": [c.label for c in ties],
        "candidates": [{**c.summary(), "vs_leader": (r.as_dict() if (r := versus_leader[c.label]) else None)}
                       for c in measured],
        "gains": gains, "beats_default_compile": beats_compile,
        "rounds": max(len(c.steps) for c in measured),
        "method": method(study, "confirm"),
        "windows": max(sum(map(len, c.windows.values())) for c in measured),
        "conclusion": conclusion(winner, leader, ties, compile_base, beats_compile),
    }


def conclusion(winner: Candidate, leader: Candidate, ties: list[Candidate], compile_base: Candidate | None,
               beats_compile: bool) -> str:
    if compile_base is None:
        lead = f"{winner.name or winner.label} leads (default compile was not raced)"
    elif beats_compile:
        lead = f"{winner.name} beats default torch.compile(model) beyond the noise"
    else:
        lead = "nothing beats default torch.compile(model) beyond the noise"
    tie = (f"; {len(ties)} candidates tie within the noise, the simplest is recommended" if len(ties) > 1 else "")
    return lead + tie + (f" (fastest on average: {leader.name or leader.label})" if leader is not winner else "")


def verdicts(study: Study) -> list[Effect]:
    """One verdict per neighbour of the winner that the verdict phase measured (one knob changed)."""
    trials = [(t, TrialRecord.of(t)) for t in phase_trials(study, "verdict")]
    winner = {a.round: s for t, a in trials if a.label == "winner" and (s := step_time(t)) is not None}
    winner_windows = {a.round: a.measured.step_s_windows for t, a in trials
                      if a.label == "winner" and a.method == "side_by_side" and step_time(t) is not None}
    cold = next((a.compile_s_cold for _, a in trials if a.label == "winner"), 0.0)
    by_label: dict[str, list[tuple[FrozenTrial, TrialRecord]]] = {}
    for t, a in trials:
        if a.label != "winner":
            by_label.setdefault(a.label, []).append((t, a))
    effects = []
    for runs in by_label.values():
        a = runs[0][1]
        key, value, ref = a.knob, a.value, a.reference
        question = KNOBS[key][0].question
        first = min(runs, key=lambda run: run[1].round)[1]
        if first.same_program_as is not None:
            effects.append(Effect(key, question, ref, value, 0.0, 0.0, 0.0, 1, True, True, basis="verdict"))
            continue
        result = first.measured
        if not result.ok:
            why = result.failure or result.status or "failed"
            effects.append(Effect(key, question, ref, value, 0.0, 0.0, 0.0, 0, True, basis="verdict",
                                  failure=f"{why}: {(result.reason or '')[:160]}"))
            continue
        rounds = [(t, a) for t, a in runs if not a.cold_run]
        steps = {a.round: s for t, a in rounds if (s := step_time(t)) is not None}
        windows = {a.round: a.measured.step_s_windows for t, a in rounds
                   if a.method == "side_by_side" and step_time(t) is not None}
        ratio: Ratio | None = paired_windows(winner_windows, windows) if windows else paired_ratio(steps, winner)
        if ratio is None:
            continue
        half = (ratio.high - ratio.low) / 2 if ratio.low is not None and ratio.high is not None else math.inf
        how = "interleaved rounds (fresh processes)"
        pays = None
        if isinstance(ratio, Paired):
            how = f"paired windows side by side in {ratio.processes} processes ({ratio.basis}" + (
                f"; {ratio.dropped} stalled round(s) left out)" if ratio.dropped else ")")
            mine = statistics.fmean(steps.values())
            theirs = statistics.fmean(winner[r] for r in steps if r in winner) if steps.keys() & winner.keys() else 0
            pays = break_even(ratio, (theirs, cold), (mine, result.compile_s), ("the winner", str(value))) \
                if theirs else None
        effects.append(Effect(key, question, ref, value, ratio.change, half, result.compile_s - cold,
                              ratio.rounds, True, basis="verdict", low=ratio.low, high=ratio.high, how=how,
                              pays_back=pays or ""))
    return sorted(effects, key=lambda e: list(KNOBS).index(e.knob))
