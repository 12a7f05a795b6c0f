"""What the repeats say: the study's noise floor, the confirmed winner, and a verdict per question.

Pure functions of the study's trials, so a resumed study, the report and MLflow read the same
answer. Every repeat is a trial with user attributes ``phase`` (``confirm`` / ``verdict``),
``round`` and ``label`` (the candidate or neighbour it measures). Within a round the candidates
ran back to back, so a round's ratio of step times cancels the machine's drift; a difference is
"measurable" only when the 95% interval of the mean log-ratio over rounds excludes zero (verdicts: with
Holm's correction over the study's neighbours); two candidates tie only when their interval lies within
``objective.tie_margin`` (:mod:`autocompile.study.statistics.decisions`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from optuna import Study
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import SIDE_BY_SIDE, compiles
from autocompile.config.knobs import KNOBS, Env
from autocompile.config.sections import ObjectiveSettings
from autocompile.study.phases.sidebyside import speed_changes
from autocompile.study.phases.together import method
from autocompile.study.records.objective import Objective
from autocompile.study.records.objective import time_to_train as time_to_train_s
from autocompile.study.records.optuna_store import feasible, interrupted, measured_trials
from autocompile.study.records.record import TrialRecord
from autocompile.study.statistics.decisions import holm, p_value, processes_to_decide, race
from autocompile.study.statistics.effect import Effect
from autocompile.study.statistics.intervals import (
    CompileSpread,
    Paired,
    break_even,
    from_rounds,
    level,
    paired_windows,
    time_to_train,
)
from autocompile.trial.timing.stats import Noise, Ratio, paired_ratio, pooled_noise

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
    return (1 if compiles(config.get("compile.scope")) else 0, changed)


def study_noise(study: Study, env: Env, kind: str = "alone") -> Noise | None:
    """Run-to-run noise of step time: one program measured in several fresh processes under one set of
    measurement settings, pooled. Two components kept apart (a single alone process must not be judged by
    the far smaller noise of side-by-side processes): ``alone`` pools a program's repeats alone in a process
    (search retries, fresh-process rounds), ``side_by_side`` its side-by-side rounds. The numerics
    reference never joins (it ran at another time and is no repeat), nor a verdict neighbour's single cold
    run."""
    groups: dict[str, list[float]] = {}
    for t in [*measured_trials(study), *phase_trials(study, "confirm"), *phase_trials(study, "verdict")]:
        step = step_time(t)
        rec = TrialRecord.of(t)
        how = SIDE_BY_SIDE if rec.method == SIDE_BY_SIDE and not rec.is_search else "alone"
        if step is not None and rec.same_program_as is None and not rec.cold_run and how == kind:
            groups.setdefault(rec.identity or "", []).append(step)
    repeated = {k: v for k, v in groups.items() if len(v) > 1}
    words = "side by side" if kind == SIDE_BY_SIDE else "alone"
    return pooled_noise(list(repeated.values()),
                        f"{len(repeated)} configuration(s) measured {words} in several fresh processes, "
                        f"{sum(map(len, repeated.values()))} measurements; the numerics reference is not pooled")


def compile_spread(study: Study, settings: ObjectiveSettings, shared_cache: bool = False) -> CompileSpread:
    """The spread of one cold compile across fresh processes, as measured in the study: the pooled sd of
    log compile seconds of every program (fingerprint) compiled cold more than once (search trials, cold
    repeats, verdict neighbours' cold runs). Nothing measured twice (or ``shared_cache``: no compile was
    cold): the prior ``objective.compile_cv``, and the source says so."""
    groups: dict[str, list[float]] = {}
    if not shared_cache:
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            rec = TrialRecord.of(t)
            m = rec.measured
            cold = rec.is_search or rec.cold_run or rec.compile_cache == "cold"
            if (cold and m.ok and m.compile_s and m.fingerprint and rec.duplicate_of is None
                    and compiles(rec.config.get("compile.scope")) and not interrupted(t)):
                groups.setdefault(m.fingerprint, []).append(m.compile_s)
    measured = pooled_noise(list(groups.values()), "")
    if measured is not None:
        programs = sum(len(v) > 1 for v in groups.values())
        return CompileSpread(measured.rel_sd, measured.df, f"measured: {programs} program(s) compiled cold "
                                                             f"more than once, {measured.df} df")
    return CompileSpread(settings.compile_cv, settings.compile_df,
                         f"prior objective.compile_cv={settings.compile_cv:g} ({settings.compile_df} df): no "
                         "program was compiled cold twice in this study")


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
    cpu: dict[int, list[float]] = field(default_factory=dict)
    """Side by side: round (process) -> its windows' CPU seconds per step, where the process recorded them."""

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


def versus(a: Candidate, b: Candidate, objective: Objective, score: bool,
           spread: CompileSpread | None = None) -> Ratio | None:
    """``a / b``: of step time, or (``score``) of the objective's score. Side by side, windows are paired
    within processes; otherwise rounds are paired, each a fresh process per candidate. Time to train
    carries each side's one cold compile with the study's compile spread (``spread``)."""
    step: Ratio | None = paired_windows(b.windows, a.windows, b.cpu, a.cpu) if a.windows and b.windows else (
        from_rounds(paired_ratio(a.steps, b.steps)))
    if step is None or not score or objective.kind == "throughput":
        return step
    spread = spread or CompileSpread(objective.settings.compile_cv, objective.settings.compile_df, "prior")
    return time_to_train(step, (b.step_s(), b.compile_s), (a.step_s(), a.compile_s),
                         objective.settings.horizon_steps, spread.cv, spread.df,
                         step_level=level(b.windows or {r: [s] for r, s in b.steps.items()}))


def confirmed(study: Study, objective: Objective) -> dict[str, Any] | None:
    """The confirmation phase's answer; None when it did not run.

    The leader has the best mean score over rounds. A candidate ties with it when their paired 95%
    interval lies within +-``objective.tie_margin`` (equivalence, not "the interval contains zero"); the
    simplest of the leader and its ties is the winner. A candidate whose interval straddles the margin is
    undetermined (with how many more processes would decide it) and never recommended over the leader.
    Gains over eager and default compile are paired intervals of step time (winner / baseline - 1;
    negative = the winner is faster) and of the objective's score (cold compile + horizon steps).
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
            if a.method == SIDE_BY_SIDE:
                c.windows[a.round] = a.measured.step_s_windows
                if a.measured.step_cpu_s_windows:
                    c.cpu[a.round] = a.measured.step_cpu_s_windows
    measured = [c for c in candidates.values() if c.steps]
    if len(measured) < 2:  # an interrupted phase, or every other candidate failed: nothing was raced
        return {"winner": None, "reason": f"{len(measured)} candidate(s) with a completed repeat: no race (an "
                                          "interrupted phase resumes when the same command runs again)",
                "candidates": [c.summary() for c in candidates.values()]}
    spread = compile_spread(study, objective.settings)

    def mean_score(c: Candidate) -> float:
        return statistics.fmean(math.log(s) for s in c.scores(objective).values())

    margin = objective.settings.tie_margin
    ratios = {}

    def against(i: int, j: int) -> Ratio | None:
        ratios[measured[i].label] = versus(measured[i], measured[j], objective, True, spread)
        return ratios[measured[i].label]

    decision = race([mean_score(c) for c in measured], [simplicity(c.config) for c in measured], against, margin)
    leader, winner = measured[decision.leader], measured[decision.winner]
    status = {c.label: s for c, s in zip(measured, decision.status, strict=True)}
    ties = [c for c in measured if status[c.label] in ("leader", "tied")]
    undetermined = [{"label": c.label, "name": c.name, "status": status[c.label],
                     "vs_leader": r.as_dict() if (r := ratios.get(c.label)) else None,
                     "more_processes": processes_to_decide(r, margin, processes(r)) if r else None}
                    for c in measured if status[c.label] in ("undetermined", "faster")]
    gains = {}
    for c in measured:
        if c.baseline in ("eager", "compile") and c is not winner:
            step = versus(winner, c, objective, False)
            score = versus(winner, c, objective, True, spread)
            gains[c.baseline] = {"step": step.as_dict() if step else None, "score": score.as_dict() if score else None,
                                 "text": step.text() if step else "no shared round"}
    compile_base = next((c for c in measured if c.baseline == "compile"), None)
    beats_compile = compile_base is not None and compile_base is not winner and (
        (g := gains.get("compile")) is not None and g["score"] is not None and g["score"]["measurable"]
        and g["score"]["change"] < 0)
    changes = [c.text(label, f"process {p}") for label, p, c in
               speed_changes({m.name or m.label: m.windows for m in measured},
                             {m.name or m.label: m.cpu for m in measured})]
    return {
        "winner": winner.summary(), "leader": leader.label, "speed_changes": changes,
        "tied_with_leader": [c.label for c in ties], "tie_margin": margin, "decided": decision.decided,
        "undetermined": undetermined, "compile_spread": spread.as_dict(),
        "candidates": [{**c.summary(), "status": status[c.label],
                        "vs_leader": (r.as_dict() if (r := ratios.get(c.label)) else None)} for c in measured],
        "gains": gains, "beats_default_compile": beats_compile,
        "rounds": max(len(c.steps) for c in measured),
        "method": method(study, "confirm"),
        "windows": max(sum(map(len, c.windows.values())) for c in measured),
        "conclusion": "; ".join([conclusion(winner, leader, ties, compile_base, beats_compile, margin, undetermined),
                                 *changes]),
    }


def processes(ratio: Ratio) -> int:
    """The processes behind a ratio (side by side), or its rounds (one fresh process per candidate each)."""
    return int(getattr(ratio, "processes", 0) or ratio.rounds)


def conclusion(winner: Candidate, leader: Candidate, ties: list[Candidate], compile_base: Candidate | None,
               beats_compile: bool, margin: float = 0.0, undetermined: list[dict[str, Any]] | None = None) -> str:
    if compile_base is None:
        lead = f"{winner.name or winner.label} leads (default compile was not raced)"
    elif beats_compile:
        lead = f"{winner.name} beats default torch.compile(model) beyond the noise"
    else:
        lead = "nothing beats default torch.compile(model) beyond the noise"
    tie = (f"; {len(ties)} candidates tie within +-{margin:.0%}, the simplest is recommended" if len(ties) > 1
           else "")
    lead += tie + (f" (fastest on average: {leader.name or leader.label})" if leader is not winner else "")
    for u in undetermined or []:
        more = u["more_processes"]
        lead += (f"; {u['name'] or u['label']} vs the leader is undetermined ("
                 + (f"about {more} more processes would decide" if more else "no interval: measure it again")
                 + ")")
    return lead


def verdicts(study: Study, objective: Objective | None = None) -> list[Effect]:
    """One verdict per neighbour of the winner that the verdict phase measured (one knob changed).

    "Measurably" is decided for the family: Holm's step-down over the neighbours' p-values keeps the chance
    of one or more false "measurably" at 5% (two families: step time, and with ``objective`` time to train,
    which decides whether a neighbour beats the winner)."""
    trials = [(t, TrialRecord.of(t)) for t in phase_trials(study, "verdict")]
    winner = {a.round: s for t, a in trials if a.label == "winner" and (s := step_time(t)) is not None}
    winner_windows = {a.round: a.measured.step_s_windows for t, a in trials
                      if a.label == "winner" and a.method == SIDE_BY_SIDE and step_time(t) is not None}
    winner_cpu = {a.round: a.measured.step_cpu_s_windows for _, a in trials
                  if a.label == "winner" and a.round in winner_windows and a.measured.step_cpu_s_windows}
    winner_changes = speed_changes({"the winner": winner_windows}, {"the winner": winner_cpu})
    cold = next((a.compile_s_cold for _, a in trials if a.label == "winner"), 0.0) or 0.0
    # Peak memory alone: each neighbour's cold run, the winner's own cold (search) trial; side by side it is shared.
    won_cold = next((a.cold_trial for _, a in trials if a.label == "winner" and a.cold_trial is not None), None)
    won_peak = TrialRecord.of(study.trials[won_cold]).measured.peak_memory_bytes if won_cold is not None else None
    won = next((a.config for _, a in trials if a.label == "winner"), {})
    spread = compile_spread(study, objective.settings) if objective is not None else None
    by_label: dict[str, list[tuple[FrozenTrial, TrialRecord]]] = {}
    for t, a in trials:
        if a.label != "winner":
            by_label.setdefault(a.label, []).append((t, a))
    effects = []
    scores: list[tuple[Effect, Paired]] = []
    for runs in by_label.values():
        a = runs[0][1]
        key, value, ref = a.knob, a.value, a.reference
        question = KNOBS[key][0].question
        first_trial, first = min(runs, key=lambda run: run[1].round)
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
        if rounds and not steps and not (bad := rounds[0][1].measured).ok:  # it could not run beside the winner
            effects.append(Effect(key, question, ref, value, 0.0, 0.0, 0.0, 0, True, basis="verdict",
                                  failure=f"not timed beside the winner ({bad.failure or bad.status}: "
                                          f"{(bad.reason or '')[:160]}); task=compare can time the two alone"))
            continue
        windows = {a.round: a.measured.step_s_windows for t, a in rounds
                   if a.method == SIDE_BY_SIDE and step_time(t) is not None}
        cpu = {a.round: a.measured.step_cpu_s_windows for _, a in rounds
               if a.round in windows and a.measured.step_cpu_s_windows}
        ratio: Ratio | None = paired_windows(winner_windows, windows, winner_cpu, cpu) if windows else \
            paired_ratio(steps, winner)
        changes = [c.text(who, f"process {p}") for who, p, c in
                   [*winner_changes, *speed_changes({str(value): windows}, {str(value): cpu})]]
        if ratio is None:
            continue
        half = (ratio.high - ratio.low) / 2 if ratio.low is not None and ratio.high is not None else math.inf
        how = "interleaved rounds (fresh processes)"
        pays = None
        shared = steps.keys() & winner.keys()
        mine = statistics.fmean(steps[r] for r in shared) if shared else 0.0
        theirs = statistics.fmean(winner[r] for r in shared) if shared else 0.0
        if isinstance(ratio, Paired):
            how = f"paired windows side by side in {ratio.processes} processes ({ratio.basis}" + (
                f"; {ratio.dropped} stalled round(s) left out)" if ratio.dropped else ")")
            pays = break_even(ratio, (theirs, cold), (mine, result.compile_s), ("the winner", str(value))) \
                if theirs else None
        step = ratio if isinstance(ratio, Paired) else from_rounds(ratio)
        score = time_to_train(step, (theirs, cold), (mine, result.compile_s or 0.0),
                              objective.settings.horizon_steps, spread.cv, spread.df,
                              step_level=level(winner_windows or {r: [s] for r, s in winner.items()})) \
            if objective is not None and spread is not None and step is not None and theirs else None
        effects.append(Effect(key, question, ref, value, ratio.change, half, (result.compile_s or 0.0) - cold,
                              ratio.rounds, True, basis="verdict", low=ratio.low, high=ratio.high, how=how,
                              pays_back=pays or "", p_value=p_value(ratio), trial=first_trial.number,
                              score_change=score.change if score else None, score_low=score.low if score else None,
                              score_high=score.high if score else None,
                              also={k: v for k, v in first.config.items() if k != key and k in won and won[k] != v},
                              speed_changes=changes,
                              memory_change=result.peak_memory_bytes / won_peak - 1
                              if result.peak_memory_bytes and won_peak else None))
        if score is not None:
            scores.append((effects[-1], score))
    tested = [e for e in effects if e.p_value is not None]
    for e, rejected in zip(tested, holm([e.p_value for e in tested]), strict=True):
        e.family, e.family_measurable = len(tested), rejected
    for (e, score), rejected in zip(scores, holm([p_value(score) for _, score in scores]), strict=True):
        e.score_p_value = p_value(score)
        e.beats_winner = rejected and score.change < 0
    return sorted(effects, key=lambda e: list(KNOBS).index(e.knob))
