"""What the phases after the search will cost, priced from how they run: the one place that reads their plans
(:mod:`autocompile.study.phases.run`), side by side or in fresh-process rounds, for the study's estimate
(:mod:`autocompile.study.estimate`). A side-by-side process is its start and builds, each compiled candidate's
warm start from its cold cache, and the timing budget; a verdict neighbour the search measured takes that run as
its cold run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from autocompile.config.choices import SIDE_BY_SIDE, compiles
from autocompile.config.knobs import TrialConfig
from autocompile.config.settings import Settings
from autocompile.config.space import CONFIRMED_BASELINES, SearchSpace, identity
from autocompile.study.phases.phase_plan import Foresight, searched_runs, verdict_side_plan
from autocompile.study.phases.plans import neighbours
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import FINISHED, METHOD, counted, interrupted
from autocompile.study.records.phase_trials import method, phase_trials
from autocompile.study.search.samplers import SHARED, eager_runs_left, lead_programs


@dataclass
class RunCosts:
    """Seconds of wall time one run of a configuration costs on this machine."""

    eager_s: float
    """A run that compiles nothing: the reference's wall time, or the study's eager trials'."""
    cold_s: float
    """A run that compiles with a cold cache (a search trial, a verdict neighbour's first run)."""
    warm_s: float
    """A repeat that compiles from its configuration's warm cache."""
    basis: str
    """Where the compile share comes from, in words."""
    start_s: float | None = None
    """A process's start, imports, model build and teardown: an eager run less its timed windows (None: the eager
    run less ``measure.max_timed_s``)."""


def trial_compiles(trial: Any) -> bool:
    """Whether a trial (or a stand-in with its ``config`` attribute) compiles anything."""
    return compiles((trial.user_attrs.get("config") or {}).get("compile.scope"))


def phase_costs(study: optuna.Study, space: SearchSpace, objective: Objective, settings: Settings,
                costs: RunCosts, winner: Any) -> tuple[float, float]:
    """Seconds left of the confirmation and the verdict phase: the one place that reads how the phases
    run (:mod:`autocompile.study.phases.run`): side by side, or in fresh-process rounds. ``winner``: the trial
    (or :func:`stand_in`) whose neighbours the verdicts are priced at."""
    if settings.study.side_by_side and all(
            METHOD[p] not in study.user_attrs or method(study, p)["method"] == SIDE_BY_SIDE
            for p in ("confirm", "verdict")):
        return _side_by_side_costs(study, space, objective, settings, costs, winner)
    return _fresh_phase_costs(study, space, objective, settings, costs, winner)


def process_s(costs: RunCosts, compiled: int, settings: Settings) -> float:
    """One side-by-side process: its start and builds (an eager run less its timed part), each compiled candidate's
    warm start from its cold cache, and the timing budget (measured on gpt2-tiny: 20 s for three candidates, one
    compiled; 16 s for three eager ones)."""
    start = costs.start_s if costs.start_s is not None else costs.eager_s - settings.measure.max_timed_s
    return max(start, 1.0) + compiled * (costs.warm_s - costs.eager_s) + settings.compare.max_timed_s


def asked_at(winner: Any, settings: Settings) -> list[str] | None:
    """The verdicts' knobs at ``winner`` (:func:`plans.asked`; every one of ``study.verdicts`` without a winner)."""
    from autocompile.study.phases.plans import asked

    s = settings.study
    return asked(winner, s.verdicts, settings.objective.memory_limit_gb)[0] if winner is not None else \
        s.verdict_knobs()


def _side_by_side_costs(study: optuna.Study, space: SearchSpace, objective: Objective, settings: Settings,
                        costs: RunCosts, winner: Any) -> tuple[float, float]:
    """Side by side: ``compare.processes`` processes per phase, minus those done; the verdicts as
    :func:`phase_plan.verdict_side_plan` lays them out (each neighbour's one brief cold run unless a search trial is
    it, then the processes of the winner and the neighbours timed nowhere beside it)."""
    from autocompile.study.phases.plans import confirm_plan

    s, processes = settings.study, settings.compare.decided_processes
    trials = study.get_trials(deepcopy=False)
    wanted = asked_at(winner, settings)
    searching = sum(counted(t) for t in trials) < s.n_trials or not any(t.state == TrialState.COMPLETE for t in trials)
    if searching:
        # The top trials and the two baselines besides eager: all but one compile.
        members = s.confirm_top + 2
        confirm_s = processes * process_s(costs, members - 1, settings) if s.confirm_top else 0.0
        foresight: Foresight | None = searched_foresight(study, space, settings, winner)
    else:
        plan = confirm_plan(study, objective, s.confirm_top, processes) if s.confirm_top else []
        labels = {slot.label: slot for slot in plan}
        compiled = sum(1 for slot in labels.values() if trial_compiles(study.trials[slot.attrs["cold_trial"]]))
        done = {t.user_attrs["round"] for t in phase_trials(study, "confirm")}
        confirm_s = (processes - len(done)) * process_s(costs, compiled, settings) if labels else 0.0
        winner = winner if wanted != [] else None
        # Until the confirmation ran, the candidates it will time beside the winner in every process.
        foresight = confirm_foresight(study, plan, winner) if len(done) < processes else None
    if winner is None or wanted == []:
        return confirm_s, 0.0
    verdicts = verdict_side_plan(study, winner, space, wanted, processes, foresight)
    # One timed window for a cold run, after a warm-up as long as the numerics check's steps (search.tell.brief_measure;
    # search trials are timed up to measure.max_timed_s more).
    brief = max(settings.measure.max_timed_s * (1 - 1 / max(settings.measure.windows, 1)), 0.0)
    cold_s = sum(max(costs.cold_s - brief, costs.warm_s) if n.compiled else max(costs.eager_s - brief, 1.0)
                 for n in verdicts.neighbours if n.runs_cold)
    compiled = sum(n.compiled for n in verdicts.members()) + verdicts.winner_compiles
    return confirm_s, cold_s + verdicts.processes_left() * process_s(costs, compiled, settings)


def confirm_foresight(study: optuna.Study, plan: list[Any], winner: Any) -> Foresight:
    """The confirmation still to run: its candidates are timed beside ``winner`` in every process when it is one."""
    if winner is None or f"#{winner.number}" not in {slot.label for slot in plan}:
        return Foresight(frozenset(searched_runs(study)))
    return Foresight(frozenset(searched_runs(study)), frozenset(
        study.trials[slot.attrs["cold_trial"]].user_attrs.get("identity") for slot in plan))


def searched_foresight(study: optuna.Study, space: SearchSpace, settings: Settings, winner: Any) -> Foresight:
    """Before the search ends: what it will have measured of ``winner``'s neighbours (its queued baselines, and with
    ``study.sampler=staged`` its lead programs and as many one-knob changes of the compiled lead as its trials left
    allow, :func:`samplers.staged`), and what the confirmation will time beside the winner (the baselines it races
    and, up to ``study.confirm_top``, the measured neighbours)."""
    found = neighbours(winner, space, asked_at(winner, settings))
    idents = [identity(config, space.env) for _, _, config in found]
    trials = study.get_trials(deepcopy=False)
    names = {t.user_attrs.get("baseline") for t in trials}
    queued = {ident: name for ident, name in space.baseline_identities().items() if name in names}
    measured = set(searched_runs(study))
    searched = measured | set(queued)
    if settings.study.sampler == "staged":
        leads = {identity(TrialConfig.from_flat(flat, space.env, strict=False), space.env)
                 for flat in lead_programs(space)}
        searched |= leads
        left = settings.study.n_trials - sum(counted(t) for t in trials) - len(leads - measured)
        left -= eager_runs_left(space, trials)
        others = [ident for (key, _, _), ident in sorted(zip(found, idents, strict=True),
                                                         key=lambda pair: pair[0][0] not in SHARED)
                  if ident not in searched]
        searched |= set(others[:max(left, 0)])
    raced = {ident for ident, name in queued.items() if name in CONFIRMED_BASELINES}
    near = [ident for ident in idents if ident in searched and ident not in raced]
    beside = raced | set(near[:max(settings.study.confirm_top - 1, 0)]) if settings.study.confirm_top else set()
    return Foresight(frozenset(searched), frozenset(beside))


def _fresh_phase_costs(study: optuna.Study, space: SearchSpace, objective: Objective, settings: Settings,
                costs: RunCosts, winner: Any) -> tuple[float, float]:
    """Seconds left of the phases in fresh-process rounds. Once the search is over, the repeats of their
    plans not yet run, at the per-run costs of ``cost_estimate``; before, the plans' sizes at
    ``costs``, the verdicts counted at the default compile's neighbours."""
    from autocompile.study.phases.plans import confirm_plan, cost_estimate, key_of, neighbours, verdict_plan

    s = settings.study
    trials = study.get_trials(deepcopy=False)
    wanted = asked_at(winner, settings)
    if sum(counted(t) for t in trials) < s.n_trials or not any(t.state == TrialState.COMPLETE for t in trials):
        n = len(neighbours(winner, space, wanted)) if wanted != [] else 0
        confirm_s = (s.confirm_top + 2) * s.repeats * costs.warm_s if s.confirm_top else 0.0
        # Round 0: the winner warm, each neighbour cold; then every member warm in each further round.
        return confirm_s, (n * costs.cold_s + (s.repeats * (n + 1) - n) * costs.warm_s) if n else 0.0

    done = {key_of(t) for t in trials if t.state in FINISHED and not interrupted(t)}

    def left_s(plan: list[Any]) -> float:
        todo = [slot for slot in plan if slot.key() not in done]
        found = cost_estimate(study, todo) if todo else 0.0
        return found if math.isfinite(found) else sum(costs.warm_s if x.warm else costs.cold_s for x in todo)

    confirm_s = left_s(confirm_plan(study, objective, s.confirm_top, s.repeats)) if s.confirm_top else 0.0
    winner = winner if wanted != [] else None
    plan = verdict_plan(study, winner, space, wanted, s.repeats) if winner is not None else []
    return confirm_s, left_s(plan) if len(plan) > s.repeats else 0.0
