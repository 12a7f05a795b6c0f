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
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace, identity
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import FINISHED, METHOD, counted, interrupted
from autocompile.study.records.phase_trials import method, phase_trials


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
    """One side-by-side process: its start and builds (an eager run), each compiled candidate's warm start
    from its cold cache, and the timing budget (measured on gpt2-tiny: 20 s for three candidates, one
    compiled; 16 s for three eager ones)."""
    return costs.eager_s + compiled * (costs.warm_s - costs.eager_s) + settings.compare.max_timed_s


def asked_at(winner: Any, settings: Settings) -> list[str] | None:
    """The verdicts' knobs at ``winner`` (:func:`plans.asked`; every one of ``study.verdicts`` without a winner)."""
    from autocompile.study.phases.plans import asked

    s = settings.study
    return asked(winner, s.verdicts, settings.objective.memory_limit_gb)[0] if winner is not None else \
        s.verdict_knobs()


def _side_by_side_costs(study: optuna.Study, space: SearchSpace, objective: Objective, settings: Settings,
                        costs: RunCosts, winner: Any) -> tuple[float, float]:
    """Side by side: ``compare.processes`` processes per phase, minus those done; verdict neighbours
    first run once cold."""
    from autocompile.study.phases.plans import confirm_plan, neighbours
    from autocompile.study.phases.run import raced, searched_runs, timed_beside

    s, processes = settings.study, settings.compare.decided_processes
    trials = study.get_trials(deepcopy=False)
    wanted = asked_at(winner, settings)
    searching = sum(counted(t) for t in trials) < s.n_trials or not any(t.state == TrialState.COMPLETE for t in trials)
    if searching:
        # The top trials and the two baselines besides eager: all but one compile.
        members = s.confirm_top + 2
        confirm_s = processes * process_s(costs, members - 1, settings) if s.confirm_top else 0.0
    else:
        plan = confirm_plan(study, objective, s.confirm_top, processes) if s.confirm_top else []
        labels = {slot.label: slot for slot in plan}
        compiled = sum(1 for slot in labels.values() if trial_compiles(study.trials[slot.attrs["cold_trial"]]))
        done = {t.user_attrs["round"] for t in phase_trials(study, "confirm")}
        confirm_s = (processes - len(done)) * process_s(costs, compiled, settings) if labels else 0.0
        winner = winner if wanted != [] else None
    if winner is None or wanted == []:
        return confirm_s, 0.0
    found = neighbours(winner, space, wanted)
    if not found:
        return confirm_s, 0.0
    finished = phase_trials(study, "verdict") if not searching else []
    ran_cold = {(t.user_attrs.get("knob"), t.user_attrs.get("value")) for t in finished if t.user_attrs.get("cold_run")}
    # A neighbour the search measured takes that trial as its cold run (phases.run.reuse_search_runs); the others
    # run once, one timed window (search trials timed up to measure.max_timed_s more). Before the search, the
    # baselines it has queued are not counted as measured: the suite's records (tests/test_estimate.py) were priced
    # so, and counting them takes bert-tiny's verdicts under its band (x0.51) for little (gpt2-tiny x3.02 -> x2.87).
    searched = searched_runs(study)
    brief = max(settings.measure.max_timed_s * (1 - 1 / max(settings.measure.windows, 1)), 0.0)
    scopes = [config.flat()["compile.scope"] for _, _, config in found]
    cold_s = sum(max(costs.cold_s - brief, costs.warm_s) if compiles(scope) else max(costs.eager_s - brief, 1.0)
                 for (key, value, config), scope in zip(found, scopes, strict=True)
                 if (key, value) not in ran_cold and identity(config, space.env) not in searched)
    rounds_done = {t.user_attrs["round"] for t in finished if not t.user_attrs.get("cold_run")}
    # Neighbours the confirmation timed beside the winner join no verdict process (before it: its baselines).
    beside = set(timed_beside(study, winner, processes)) if not searching else raced(study) if s.confirm_top else set()
    left = [scope for (_, _, conf), scope in zip(found, scopes, strict=True) if identity(conf, space.env) not in beside]
    compiled = sum(compiles(scope) for scope in left) + trial_compiles(winner)
    verdict_s = cold_s + ((processes - len(rounds_done)) * process_s(costs, compiled, settings) if left else 0.0)
    return confirm_s, verdict_s


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
