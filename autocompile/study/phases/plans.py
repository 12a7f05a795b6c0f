"""The plans of the confirmation and verdict phases: which configurations run again, in which rounds (pure
functions of the study's records; :mod:`autocompile.study.phases.repeats` runs them).

A search ranks configurations by one short measurement each, and one fresh process differs from the
next by more (6-16% on the project's 2-core VM) than most knobs change step time. So after the search:

1. **confirm** (racing, as irace and SMAC3's intensifier do): the best ``study.confirm_top``
   distinct programs and the baselines eager and default ``torch.compile(model)`` run again,
   ``study.repeats`` rounds, each round every candidate once, round-robin with a rotating start,
   so that drift of the machine hits every candidate alike;
2. **verdict**: the winner's one-knob neighbours, one per question (``study.verdicts``), again in
   rounds with the winner. A neighbour that compiles the winner's very program is stopped after
   its warm-up: "identical program", no repeats needed.

Every repeat is an Optuna trial (user attributes ``phase``, ``round``, ``label``), never deduped,
not counted in ``study.n_trials``. The plan is a function of the study's records, so a killed
study resumes where it stopped. With ``study.repeat_cache=warm`` a repeat reuses its configuration's
inductor cache (its search trial's, or a neighbour's first, cold, run): its steps are timed in a
fresh process after a cheap compile, and the compile time reported stays the cold measurement.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import Knobs
from autocompile.config.knobs import KNOBS, KnobError, TrialConfig, describe
from autocompile.config.sections import StudySettings
from autocompile.config.space import CONFIRMED_BASELINES, SearchSpace
from autocompile.study.phases.confirmation import confirmed
from autocompile.study.phases.racing import alone_noise, verdicts
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import feasible, measured_trials
from autocompile.study.records.phase_trials import phase_trials, step_time
from autocompile.study.records.record import TrialRecord, user_attrs
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE, prune_margin
from autocompile.trial.timing.rounds import rotate

log = logging.getLogger(__name__)


@dataclass
class Slot:
    """One planned repeat: a configuration in one round of one phase."""

    phase: str
    round: int
    label: str
    params: Knobs
    attrs: dict[str, Any] = field(default_factory=dict)
    """Further user attributes (candidate, cache_from, same_as, knob/value...)."""
    warm: bool = False
    """Times its steps with a warm cache (an earlier cold run of the same configuration exists)."""

    def key(self) -> tuple[str, int, str]:
        return (self.phase, self.round, self.label)


def key_of(trial: FrozenTrial) -> tuple[str, int, str] | None:
    a = TrialRecord.of(trial)
    return (a.phase, a.round, a.label or "") if a.round is not None else None


# -- plans ---------------------------------------------------------------------------------------------

def confirm_plan(study: optuna.Study, objective: Objective, top: int, repeats: int) -> list[Slot]:
    """The best ``top`` distinct programs of the search, the best of each scope the search cannot rule out
    (:func:`open_scopes`) and the eager / default-compile baselines (and a script's own compile arguments,
    ``as_written``)."""
    ranked = ranked_trials(study, objective)
    chosen: list[tuple[FrozenTrial, TrialRecord]] = []
    programs: set[str] = set()

    def take(t: FrozenTrial, rec: TrialRecord) -> None:
        fingerprint = rec.measured.fingerprint or rec.identity
        if fingerprint not in programs:
            chosen.append((t, rec))
            programs.add(fingerprint)

    for t, rec in ranked:
        if len(chosen) < top:
            take(t, rec)
    if top:
        for t, rec in open_scopes(study, objective, ranked):
            take(t, rec)
    for t, rec in ranked:
        if rec.baseline in CONFIRMED_BASELINES and all(t is not c for c, _ in chosen):
            chosen.append((t, rec))
    if len(chosen) < 2:
        return []  # nothing to race
    return [Slot("confirm", r, f"#{t.number}", t.params, user_attrs(
        candidate=t.number, baseline=rec.baseline, name=rec.name, compile_s_cold=rec.measured.compile_s,
        cache_from=rec.trial_dir, cold_trial=t.number,
    ), warm=True) for r in range(repeats) for t, rec in rotate(chosen, r)]


def open_scopes(study: optuna.Study, objective: Objective, ranked: list[tuple[FrozenTrial, TrialRecord]]
                ) -> list[tuple[FrozenTrial, TrialRecord]]:
    """The best search trial of each ``compile.scope`` whose score the search cannot rule out against the best's:
    one alone process each, and one process can run 30-70 % slow on a busy machine (issue 50: a seed whose one
    train-step process ran slow never raced it, and recommended eager). Ruled out only beyond the prune rule's
    margin (:func:`decisions.prune_margin`: both sides' process noise, the best's luck as the least of the
    search's trials) at the study's alone noise, or a related answer's or the prior where it measured none."""
    if not ranked:
        return []
    noise = alone_noise(study)
    margin = prune_margin(noise if noise is not None else PRIOR_ALONE_NOISE, 0.0, len(ranked))
    best = objective.score(ranked[0][1].measured)
    found: dict[object, tuple[FrozenTrial, TrialRecord]] = {}
    for t, rec in ranked:
        found.setdefault(rec.config.get("compile.scope"), (t, rec))
    return [(t, rec) for t, rec in found.values()
            if abs(math.log(objective.score(rec.measured) / best)) <= margin]


def ranked_trials(study: optuna.Study, objective: Objective) -> list[tuple[FrozenTrial, TrialRecord]]:
    """The search's feasible complete trials, best first under the objective's score."""
    found = [(t, TrialRecord.of(t)) for t in measured_trials(study) if t.state == TrialState.COMPLETE and feasible(t)]
    return sorted(found, key=lambda pair: objective.score(pair[1].measured))


def winner_trial(study: optuna.Study, objective: Objective) -> FrozenTrial | None:
    """The confirmed winner's search trial, or (no confirmation) the search's best."""
    outcome = confirmed(study, objective)
    if outcome and outcome.winner:
        return study.trials[outcome.winner.trial]
    ranked = ranked_trials(study, objective)
    return ranked[0][0] if ranked else None


def recommended(study: optuna.Study, objective: Objective) -> tuple[FrozenTrial | None, str]:
    """What the study recommends and why it changed, if it did: the confirmed winner (or the search's best),
    unless a verdict neighbour measured beside it is measurably faster to train (time to train, after
    Holm's correction over the neighbours): then the fastest such neighbour, whose own cold run holds its
    configuration and measurement. A study never recommends what something it measured beats."""
    winner = winner_trial(study, objective)
    beaters = [e for e in verdicts(study, objective) if e.beats_winner and e.trial is not None
               and step_time(study.trials[e.trial]) is not None]
    if winner is None or not beaters:
        return winner, ""
    best = min(beaters, key=lambda e: e.score_change if e.score_change is not None else 0.0)
    return study.trials[best.trial], (  # type: ignore[index]
        f"changed from trial {winner.number} ({TrialRecord.of(winner).name}): its verdict neighbour "
        f"{best.knob}={best.value} trains measurably faster ({best.score_change:+.1%} time to train "
        f"[95% CI {(best.score_low or 0) * 100:+.1f}, {(best.score_high or 0) * 100:+.1f}], Holm over "
        f"{best.family} verdicts)")


def asked(winner: FrozenTrial, verdicts: Any, memory_limit_gb: float) -> tuple[list[str] | None, dict[str, str]]:
    """The knobs whose verdicts the phase asks at ``winner`` (as :func:`neighbours` takes them: None = every knob
    with a question) and, for ``study.verdicts=auto``, the questions left out, each with why it cannot change
    the recommendation. Activation checkpointing recomputes what it does not keep: it buys memory with step
    time, so it cannot make a winner that does not checkpoint train faster unless memory binds (a memory limit
    set, where it can make a faster program fit; a winner that checkpoints, whose neighbour without is asked)."""
    if verdicts != "auto":
        return StudySettings.knobs_of(verdicts), {}
    config = TrialRecord.of(winner).config
    left: dict[str, str] = {}
    if memory_limit_gb <= 0 and config.get("ac.policy", KNOBS["ac.policy"][1]) == "none":
        left["ac.policy"] = ("activation checkpointing trades step time for memory, and no memory limit binds "
                             "(objective.memory_limit_gb=0): it cannot make the winner train faster; "
                             "study.verdicts=all asks it")
    return [key for key, (spec, _) in KNOBS.items() if spec.question and key not in left], left


def neighbours(winner: FrozenTrial, space: SearchSpace, wanted: list[str] | None,
               left_out: list[str] | None = None) -> list[tuple[str, Any, TrialConfig]]:
    """(knob, value, configuration) for every searched knob with a question, changed at the winner.

    A change that makes another knob invalid (train_step with fused AdamW) is asked with the nearest valid
    configuration (:func:`nearest_valid`: only the knobs it invalidates change, each to its default or its
    first allowed value); one that cannot be made valid is left out, and why is appended to ``left_out``
    (the estimate asks for the neighbours at every trial: only the verdict phase says it)."""
    env = space.env
    full = TrialConfig.from_flat(TrialRecord.of(winner).config, env, strict=False).flat()
    found = []
    values: Knobs = {}
    for key, (spec, _) in KNOBS.items():
        options = space.options(key, values)
        values[key] = full[key]
        if not spec.question or len(options) < 2 or (wanted is not None and key not in wanted):
            continue
        for value in options:
            if value == full[key]:
                continue
            try:
                found.append((key, value, TrialConfig.from_flat({**full, key: value}, env, strict=False)))
            except KnobError as exc:
                config = nearest_valid(full, key, value, space)
                if config is not None:
                    found.append((key, value, config))
                elif left_out is not None:
                    left_out.append(f"{key}={value}: {exc}")
    return found


def nearest_valid(full: Knobs, key: str, value: Any, space: SearchSpace) -> TrialConfig | None:
    """``full`` with ``key`` = ``value`` made valid by changing the fewest other knobs: walking the knob table
    in order, each knob whose value the ones before it no longer allow takes its default (or its first
    allowed value); None when that is no valid configuration either."""
    flat = {**full, key: value}
    values: Knobs = {}
    for k, (_, default) in KNOBS.items():
        options = space.options(k, values)
        if k != key and flat[k] not in options:
            flat[k] = default if default in options else options[0]
        values[k] = flat[k]
    try:
        return TrialConfig.from_flat(flat, space.env, strict=False)
    except KnobError:
        return None


def verdict_plan(study: optuna.Study, winner: FrozenTrial, space: SearchSpace, wanted: list[str] | None,
                 repeats: int) -> list[Slot]:
    """Rounds of the winner and its neighbours; a neighbour found identical or failed in its cold run (round -1) or
    in round 0 drops out. A repeat starts warm from its neighbour's cold cache: the cold run's directory, else
    round 0's when that round compiled cold (a warm repeat's own directory holds no cache: T5's fallback rounds
    compiled every neighbour cold again, ~50 s each)."""
    env = space.env
    first = {rec.label: t for t in phase_trials(study, "verdict") if (rec := TrialRecord.of(t)).round == 0}
    ran_cold, decided = cold_runs(study)
    won = TrialRecord.of(winner)
    members = [Slot("verdict", 0, "winner", winner.params, user_attrs(
        candidate=winner.number, name=won.name, compile_s_cold=won.measured.compile_s, cache_from=won.trial_dir),
        warm=True)]
    for key, value, config in neighbours(winner, space, wanted):
        members.append(Slot("verdict", 0, f"{key}={value}", space.params(config.flat()), user_attrs(
            knob=key, value=value, reference=won.config.get(key, KNOBS[key][1]), name=describe(config, env),
            same_as=won.measured.fingerprint, same_as_trial=winner.number)))
    plan = []
    for r in range(repeats):
        for m in rotate(members, r):
            if m.label in decided:
                continue  # its cold run compiled the winner's program, or failed: nothing to repeat
            if r > 0 and m.label != "winner":
                done = first.get(m.label)
                if done is not None and step_time(done) is None:
                    continue  # identical program, or failed: nothing to repeat
                cold = ran_cold.get(m.label)
                m = Slot("verdict", r, m.label, m.params, {**m.attrs, "same_as": None, "cache_from": cold.trial_dir
                         if cold is not None else TrialRecord.of(done).trial_dir if done is not None else None},
                         warm=True)
            elif (c := ran_cold.get(m.label)) is not None:  # round 0 warm from its cold run, not compiled again
                m = Slot("verdict", r, m.label, m.params, {**m.attrs, "same_as": None, "cache_from": c.trial_dir,
                                                           "compile_s_cold": c.measured.compile_s}, warm=True)
            else:
                m = Slot("verdict", r, m.label, m.params, dict(m.attrs), warm=m.warm)
            plan.append(m)
    return plan


def cold_runs(study: optuna.Study) -> tuple[dict[str, TrialRecord], set[str]]:
    """The verdict neighbours' single cold runs (round -1), in one pass: those that measured a program other than the
    winner's, by label (a phase that fell back from side by side to fresh-process rounds starts their repeats warm
    from them; T5: the cold round 0 repeated 678 s of compiling), and the labels the cold run decided (the winner's
    program, or failed: their verdict reads it and nothing is repeated)."""
    timed: dict[str, TrialRecord] = {}
    decided: set[str] = set()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)):
        rec = TrialRecord.of(t)
        if rec.phase != "verdict" or not rec.cold_run or not rec.label or rec.interrupted:
            continue
        if step_time(t) is None:
            decided.add(rec.label)
        elif rec.same_program_as is None:
            timed[rec.label] = rec
    return timed, decided


def cost_estimate(study: optuna.Study, plan: list[Slot]) -> float:
    """Seconds a fresh-process plan will take, from the search's wall times: a cold run as a search trial took;
    a warm one without most of its compile time (side by side: ``study.phase_costs.process_s``)."""
    walls = [(r.wall_s, r.compile_s) for t in measured_trials(study)
             if (r := TrialRecord.of(t).measured).ok and r.wall_s is not None]
    if not walls:
        return float("nan")
    cold = statistics.median(w for w, _ in walls)
    warm = statistics.median(max(w - c, 1.0) for w, c in walls)
    return sum(warm if slot.warm else cold for slot in plan)


def describe_plan(name: str, plan: list[Slot], side_by_side: bool = False) -> str:
    labels = list(dict.fromkeys(slot.label for slot in plan))
    rounds = len({slot.round for slot in plan})
    how = (f"side by side in {rounds} fresh processes (windows in rotating order)" if side_by_side else
           f"x up to {rounds} rounds = {len(plan)} runs in fresh processes, interleaved")
    return f"{name} phase: {len(labels)} configurations {how}: {', '.join(labels)}"
