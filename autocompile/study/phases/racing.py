"""What the repeats say: the study's noise floor, the compile spread, and a verdict per question (the
confirmed winner: :mod:`autocompile.study.phases.confirmation`).

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

from optuna import Study
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import SIDE_BY_SIDE, Knobs, compiles
from autocompile.config.knobs import KNOBS
from autocompile.config.sections import ObjectiveSettings
from autocompile.study.phases.sidebyside import speed_changes
from autocompile.study.records.compile_prior import study_prior
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import NOT_ASKED, REFERENCE, VERDICT_LOOK, interrupted, measured_trials
from autocompile.study.records.phase_trials import phase_trials, step_time
from autocompile.study.records.record import TrialRecord
from autocompile.study.statistics.decisions import ALPHA, LOOK_ALPHAS, holm, p_value, two_looks, window_spread
from autocompile.study.statistics.effect import Effect
from autocompile.study.statistics.intervals import (
    CompileSpread,
    Paired,
    Ratio,
    at_level,
    break_even,
    from_rounds,
    level,
    paired_ratio,
    paired_windows,
    pooled_spread,
    t_quantile,
    time_to_train,
)
from autocompile.study.statistics.noise import Noise, pooled_noise

REPEAT_PHASES = ("confirm", "verdict")
NOISE_PRIOR = "alone_noise_prior"
"""Study attribute: the alone processes' noise a related answer's study measured (``rel_sd``, ``df``, ``source``;
``study.reuse``), standing in for :data:`decisions.PRIOR_ALONE_NOISE` until this study measures its own."""


def simplicity(config: Knobs) -> tuple[int, int]:
    """Eager first (nothing to apply), then the fewest knobs changed from torch.compile's defaults."""
    changed = sum(1 for k, v in config.items() if k in KNOBS and v != KNOBS[k][1])
    return (1 if compiles(config.get("compile.scope")) else 0, changed)


def study_noise(study: Study, kind: str = "alone") -> Noise | None:
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


def alone_noise(study: Study) -> float | None:
    """The run-to-run noise of alone processes the study's rules use: its own once measured, else a related
    answer's (:data:`NOISE_PRIOR`), else None (the rules' prior)."""
    if (noise := study_noise(study, "alone")) is not None:
        return noise.rel_sd
    kept = study.user_attrs.get(NOISE_PRIOR)
    return float(kept["rel_sd"]) if kept else None


def alone_window_spread(study: Study) -> float | None:
    """How far a window strays from its process's level in the study's alone processes (the numerics reference
    and the search's measured trials), pooled by windows (:func:`decisions.window_spread`): the pruning rule's
    reading of how much this machine's speed moves while it runs."""
    searched = [rec.measured for t in measured_trials(study) if (rec := TrialRecord.of(t)).is_search]
    runs = [(m.step_s_cv, m.windows) for m in searched if m.step_s_cv is not None and m.windows]
    ref = study.user_attrs.get(REFERENCE) or {}
    if ref.get("step_s_cv") is not None and ref.get("windows") and not ref.get("reused_from"):  # another day's
        runs.append((ref["step_s_cv"], ref["windows"]))
    return window_spread(runs)


def compile_spread(study: Study, settings: ObjectiveSettings, shared_cache: bool = False) -> CompileSpread:
    """The spread of one cold compile across fresh processes: the study's prior (``compile_prior``) pooled with
    what the study measured, the pooled sd of log compile seconds of every program (fingerprint) compiled cold
    more than once (search trials, cold repeats, verdict neighbours' cold runs), weighted by degrees of freedom.
    Nothing measured twice (or ``shared_cache``: no compile was cold): the prior; the source says which."""
    groups: dict[str, list[float]] = {}
    if not shared_cache:
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
            rec = TrialRecord.of(t)
            m = rec.measured
            cold = rec.is_search or rec.cold_run or rec.compile_cache == "cold"
            if (cold and m.ok and m.compile_s and m.fingerprint and rec.duplicate_of is None and rec.cold_from is None
                    and compiles(rec.config.get("compile.scope")) and not interrupted(t)):
                groups.setdefault(m.fingerprint, []).append(m.compile_s)
    measured = pooled_noise(list(groups.values()), "")
    programs = sum(len(v) > 1 for v in groups.values())
    return pooled_spread(study_prior(study, settings), measured.rel_sd if measured else None,
                         measured.df if measured else 0, programs)


def verdicts(study: Study, objective: Objective | None = None) -> list[Effect]:
    """One verdict per neighbour of the winner that the verdict phase measured (one knob changed).

    "Measurably" is decided for the family: Holm's step-down over the neighbours' p-values keeps the chance
    of one or more false "measurably" at 5% (two families: step time, and with ``objective`` time to train,
    which decides whether a neighbour beats the winner). Side by side in 5 or more processes the phase was read
    twice (:func:`decisions.two_looks`): a neighbour decided in both families after the first half left the
    later processes, and its verdict is that look's, its intervals at 99 %; the rest are read at the end, at
    96 % (the 5 % split between the looks)."""
    measured = _measured_verdicts(study, objective)
    return _sorted(measured + not_asked(study)) if measured else []


def not_asked(study: Study) -> list[Effect]:
    """The questions ``study.verdicts=auto`` left out at the winner, each saying why (nothing measured)."""
    won = next((rec.config for t in phase_trials(study, "verdict") if (rec := TrialRecord.of(t)).label == "winner"),
               {})
    return [Effect(key, KNOBS[key][0].question, won.get(key, KNOBS[key][1]), None, 0.0, 0.0, 0.0, 0, False,
                   basis="verdict", not_asked=why) for key, why in (study.user_attrs.get(NOT_ASKED) or {}).items()
            if key in KNOBS]


def _measured_verdicts(study: Study, objective: Objective | None) -> list[Effect]:
    look = study.user_attrs.get(VERDICT_LOOK)
    if look is None:
        reads = _reads(study, objective)
        _decide(reads, [e.p_value for e, _, _ in reads], [p_value(s) for _, _, s in reads], ALPHA)
        return [e for e, _, _ in reads]
    first = {_label(read[0]): read for read in _reads(study, objective, before=look)}
    stopped = stopped_at(list(first.values()))
    reads = [first[_label(r[0])] if _label(r[0]) in stopped else r for r in _reads(study, objective)]
    early = [first.get(_label(e)) for e, _, _ in reads]  # each one's read at the first look (None: none then)
    stop_step, end_step = two_looks([r[0].p_value if r else None for r in early], [e.p_value for e, _, _ in reads])
    stop_score, end_score = two_looks([p_value(r[2]) if r else None for r in early], [p_value(s) for _, _, s in reads])
    family = sum(e.p_value is not None for e, _, _ in reads)
    for (e, step, score), a1, a2, b1, b2 in zip(reads, stop_step, end_step, stop_score, end_score, strict=True):
        done = _label(e) in stopped
        _read(e, step, score, LOOK_ALPHAS[0] if done else LOOK_ALPHAS[1], family, a1 or a2, b1 or b2)
        e.look = 1 if done else 2
    return [e for e, _, _ in reads]


Read = tuple[Effect, Paired | None, Paired | None]
"""A neighbour's verdict before the family's decision, its step ratio and its time-to-train ratio (None: none)."""


def stopped_at(first: list[Read]) -> set[str]:
    """The neighbours (labels) decided at the first look: measurably different in step time (Holm at
    ``LOOK_ALPHAS[0]``), and in time to train where the study has an objective, either decided alike or out of
    reach of the later processes (:func:`beyond_processes`); they leave the phase."""
    steps = holm([e.p_value for e, _, _ in first], LOOK_ALPHAS[0])
    scores = holm([p_value(s) for _, _, s in first], LOOK_ALPHAS[0])
    return {_label(e) for (e, _, score), a, b in zip(first, steps, scores, strict=True)
            if a and (b or score is None or beyond_processes(e, score))}


def beyond_processes(e: Effect, score: Paired) -> bool:
    """Whether more side-by-side processes cannot decide this time to train: at its estimate, the part of its
    interval that the two cold compiles leave (``Effect.score_floor``; no process adds a cold compile) already
    covers no change at the end's level. Read at the interval's own degrees of freedom (not the floor's, which are
    fewer), so its end-level interval, whose variance holds the floor's, covers no change too: its p-value exceeds
    ``LOOK_ALPHAS[1]``, and stopping it can reject nothing, only save processes."""
    if e.score_floor is None or score.df < 1:
        return False
    return abs(math.log1p(score.change)) <= t_quantile(score.df, 1 - LOOK_ALPHAS[1]) * e.score_floor


def decided_early(study: Study, objective: Objective | None) -> set[str]:
    """The labels the verdict phase's first look stops (none before it: ``VERDICT_LOOK`` unset, or fewer
    processes run)."""
    look = study.user_attrs.get(VERDICT_LOOK)
    return stopped_at(_reads(study, objective, before=look)) if look is not None else set()


def _label(e: Effect) -> str:
    return f"{e.knob}={e.value}"


def _sorted(effects: list[Effect]) -> list[Effect]:
    return sorted(effects, key=lambda e: list(KNOBS).index(e.knob))


def _decide(reads: list[Read], steps: list[float | None], scores: list[float | None], alpha: float) -> None:
    for (e, step, score), a, b in zip(reads, holm(steps, alpha), holm(scores, alpha), strict=True):
        _read(e, step, score, alpha, sum(p is not None for p in steps), a, b)


def _read(e: Effect, step: Paired | None, score: Paired | None, alpha: float, family: int, step_rejected: bool,
          score_rejected: bool) -> None:
    """The family's decision on one verdict, and its intervals at the level it was decided at."""
    if e.p_value is not None:
        e.family, e.family_measurable = family, step_rejected
    if step is not None and alpha != ALPHA:
        shown = at_level(step, 1 - alpha)
        e.low, e.high, e.level = shown.low, shown.high, 1 - alpha
        e.uncertainty = (shown.high - shown.low) / 2 if shown.low is not None and shown.high is not None else \
            e.uncertainty
    if score is not None:
        shown = at_level(score, 1 - alpha) if alpha != ALPHA else score
        e.score_change, e.score_low, e.score_high = shown.change, shown.low, shown.high
        e.score_p_value = p_value(score)
        e.score_spread = score.basis.rpartition(" + ")[2]  # "cold compile spread 10.0% on 9 df"
        e.beats_winner = score_rejected and score.change < 0
        e.score_measurable = score_rejected


def _reads(study: Study, objective: Objective | None, before: int | None = None) -> list[Read]:
    """Every neighbour's verdict from the phase's rounds before ``before`` (None: all), undecided."""
    every = [(t, TrialRecord.of(t)) for t in phase_trials(study, "verdict")]
    trials = [(t, a) for t, a in every if before is None or a.round < before]  # a cold run is round -1
    confirm = [(t, TrialRecord.of(t)) for t in phase_trials(study, "confirm")]
    won_runs = [(t, a) for t, a in trials if a.label == "winner"]
    won_rounds = _rounds(won_runs)
    # The winner as the confirmation timed it: every neighbour timed there leaves no verdict process to time it in.
    number = next((a.same_as_trial for _, a in trials if a.cold_run and a.same_as_trial is not None), None)
    won_confirm = [(t, a) for t, a in confirm if a.label == f"#{number}"]
    confirm_rounds = _rounds(won_confirm)  # what a neighbour timed in the confirmation pairs with
    won_runs = won_runs or won_confirm
    cold = next((a.compile_s_cold for _, a in won_runs), 0.0) or 0.0
    # Peak memory alone: each neighbour's cold run, the winner's own cold (search) trial; side by side it is shared.
    won_cold = next((a.cold_trial for _, a in won_runs if a.cold_trial is not None), None)
    won_peak = TrialRecord.of(study.trials[won_cold]).measured.peak_memory_bytes if won_cold is not None else None
    won = next((a.config for _, a in won_runs), {})
    spread = compile_spread(study, objective.settings) if objective is not None else None
    by_label: dict[str, list[tuple[FrozenTrial, TrialRecord]]] = {}
    for t, a in trials:
        if a.label != "winner":
            by_label.setdefault(a.label, []).append((t, a))
    reads: list[Read] = []
    for runs in by_label.values():
        a = runs[0][1]
        key, value, ref = a.knob, a.value, a.reference
        question = KNOBS[key][0].question
        first_trial, first = min(runs, key=lambda run: run[1].round)
        if first.same_program_as is not None:
            reads.append((Effect(key, question, ref, value, 0.0, 0.0, 0.0, 1, True, True, basis="verdict"), None, None))
            continue
        result = first.measured
        compile_s = first.cold_compile_s  # a warm round 0 (its cold run came first) carries the cold one
        if not result.ok:
            why = result.failure or result.status or "failed"
            reads.append((Effect(key, question, ref, value, 0.0, 0.0, 0.0, 0, True, basis="verdict",
                                 failure=f"{why}: {(result.reason or '')[:160]}"), None, None))
            continue
        rounds = [(t, a) for t, a in runs if not a.cold_run]
        against, where = won_rounds, ""
        if not rounds and first.timed_in:  # timed beside the winner in the confirmation's processes
            if before is not None:
                continue  # read once, at the end: the first look stops only what the verdict processes time
            rounds = [(t, a) for t, a in confirm if a.label == first.timed_in]
            against = confirm_rounds
            where = "the confirmation's "
        steps, windows, cpu = _rounds(rounds)
        if rounds and not steps and not (bad := rounds[0][1].measured).ok:  # it could not run beside the winner
            reads.append((Effect(key, question, ref, value, 0.0, 0.0, 0.0, 0, True, basis="verdict",
                                 failure=f"not timed beside the winner ({bad.failure or bad.status}: "
                                         f"{(bad.reason or '')[:160]}); task=compare can time the two alone"),
                          None, None))
            continue
        winner, winner_windows, winner_cpu = against
        ratio: Ratio | None = paired_windows(winner_windows, windows, winner_cpu, cpu) if windows else \
            paired_ratio(steps, winner)
        changes = [c.text(who, f"process {p}") for who, p, c in
                   [*speed_changes({"the winner": winner_windows}, {"the winner": winner_cpu}),
                    *speed_changes({str(value): windows}, {str(value): cpu})]]
        if ratio is None:
            continue
        half = (ratio.high - ratio.low) / 2 if ratio.low is not None and ratio.high is not None else math.inf
        how = "interleaved rounds (fresh processes)"
        pays = None
        shared = steps.keys() & winner.keys()
        mine = statistics.fmean(steps[r] for r in shared) if shared else 0.0
        theirs = statistics.fmean(winner[r] for r in shared) if shared else 0.0
        if isinstance(ratio, Paired):
            how = f"paired windows side by side in {where}{ratio.processes} processes ({ratio.basis}" + (
                f"; {ratio.dropped} stalled round(s) left out)" if ratio.dropped else ")")
            pays = break_even(ratio, (theirs, cold), (mine, compile_s), ("the winner", str(value))) \
                if theirs else None
        step = ratio if isinstance(ratio, Paired) else from_rounds(ratio)
        score = time_to_train(step, (theirs, cold), (mine, compile_s or 0.0),
                              objective.settings.horizon_steps, spread.cv, spread.df,
                              step_level=level(winner_windows or {r: [s] for r, s in winner.items()})) \
            if objective is not None and spread is not None and step is not None and theirs else None
        reads.append((Effect(key, question, ref, value, ratio.change, half, (compile_s or 0.0) - cold,
                             ratio.rounds, True, basis="verdict", low=ratio.low, high=ratio.high, how=how,
                             pays_back=pays or "", p_value=p_value(ratio), trial=first_trial.number,
                             also={k: v for k, v in first.config.items() if k != key and k in won and won[k] != v},
                             speed_changes=changes,
                             memory_change=result.peak_memory_bytes / won_peak - 1
                             if result.peak_memory_bytes and won_peak else None,
                             score_floor=score.floor_se if score is not None else None),
                      step, score))
    return reads


Rounds = tuple[dict[int, float], dict[int, list[float]], dict[int, list[float]]]
"""One candidate's repeats by round: step times, and side by side its windows' step and CPU seconds."""


def _rounds(runs: list[tuple[FrozenTrial, TrialRecord]]) -> Rounds:
    steps = {a.round: s for t, a in runs if (s := step_time(t)) is not None and a.round is not None}
    windows = {r: a.measured.step_s_windows or [] for t, a in runs
               if a.method == SIDE_BY_SIDE and (r := a.round) is not None and r in steps}
    cpu = {r: a.measured.step_cpu_s_windows for _, a in runs
           if (r := a.round) is not None and r in windows and a.measured.step_cpu_s_windows}
    return steps, windows, cpu
