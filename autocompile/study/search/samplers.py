"""Search strategies (``study.sampler``): which configuration a study measures next.

- ``staged``: start where a practitioner on this hardware starts, then one knob at a time. First eager,
  ``torch.compile(model)``, regional compile and the compiled train step, in the lead precision
  (``study.start_precision``: bf16 autocast on a GPU that runs it natively); then the knobs eager shares
  with compiled programs (``SHARED``: mixed precision, checkpointing, optimizer implementation) one at a
  time on the best eager and on the best compiled lead (eager first only while it is within reach of the
  leader: :func:`shared_order`): precision and scope are not independent (bf16 is slow eager on a CPU and
  fast compiled), so each is settled on the program it would run with; then the compiled knobs one at a
  time from the best compiled program (mode, granularity, reducer...). Each step keeps a change only when
  it measured better than the incumbent by more than the noise of one alone process (``margin``); then
  TPE, which by then learns from every run before it. The seed orders the knobs within each stage, so
  seeds explore different paths.
- ``tpe``: Optuna's TPE over the conditional space (multivariate, grouped), 8 random trials first.
- ``random``: uniform over the knobs' values.
- ``gp``: Optuna's GPSampler (categorical kernels) over the knobs every trial has; the others at random.
- ``every``: every configuration of the space once, in a seeded order (the tabular benchmark's table).

The plans are stateless: each reads the study's trials (their recorded configuration and value), so a
resumed study, or several tuners on one storage, continue the same plan.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import Knobs, compiles
from autocompile.config.knobs import TrialConfig
from autocompile.config.sections import SAMPLERS
from autocompile.config.space import DEFAULTS, SearchSpace, identity
from autocompile.study.records.optuna_store import feasible
from autocompile.study.records.record import TrialRecord
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE

SHARED = ("amp.dtype", "ac.policy", "optim.impl")
"""Knobs an eager program has too: settled on eager runs, which cost no compile."""

TPE_STARTUP_TRIALS = 8

Flat = Knobs
Plan = Callable[["Seen"], Flat | None]
"""What the study tried -> the next configuration to measure (every knob's value), or None: the fallback
sampler's turn."""


def make_sampler(name: str, space: SearchSpace, seed: int,
                 margin: float = PRIOR_ALONE_NOISE) -> optuna.samplers.BaseSampler:
    """The sampler ``study.sampler=name`` names, seeded; ``margin``: ``staged``'s near-tie margin."""
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "gp":
        # A Gaussian process over the knobs every trial has (the intersection space); the rest at random.
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=TPE_STARTUP_TRIALS,
                                         warn_independent_sampling=False)
    if name == "tpe":
        return tpe(seed)
    if name == "every":
        return PlanSampler(space, every(space, seed), optuna.samplers.RandomSampler(seed=seed))
    if name == "staged":
        return PlanSampler(space, staged(space, seed, margin), tpe(seed))
    raise ValueError(f"study.sampler={name!r}: choose one of {', '.join(SAMPLERS)}")


def tpe(seed: int) -> optuna.samplers.TPESampler:
    """TPE with a multivariate, grouped model: the conditional space's knobs are modelled together."""
    with warnings.catch_warnings():  # multivariate and group are "experimental" since Optuna 2.2
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(multivariate=True, group=True, seed=seed,
                                          n_startup_trials=TPE_STARTUP_TRIALS)


class PlanSampler(optuna.samplers.BaseSampler):
    """A trial whose ``plan`` names a configuration takes exactly it (the same params ``enqueue_trial``
    would fix); without one, ``fallback`` samples as it would alone."""

    def __init__(self, space: SearchSpace, plan: Plan, fallback: optuna.samplers.BaseSampler) -> None:
        self.space = space
        self.plan = plan
        self.fallback = fallback
        self.planned: dict[int, Knobs] = {}
        """Params of the trials this sampler planned, until told: another slot's trial is asked before
        it records its configuration, and must not be planned twice."""

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self.fallback.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs:
            return  # queued (a baseline, a retry): it takes the params it was queued with
        flat = self.plan(Seen(self.space, study.get_trials(deepcopy=False), study.directions, self.planned))
        if flat is not None:
            self.planned[trial.number] = self.space.params(flat)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if trial.number in self.planned:
            return {}
        return self.fallback.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> Knobs:
        if trial.number in self.planned:
            return {}
        return self.fallback.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        params = self.planned.get(trial.number, {})
        if param_name in params:
            return params[param_name]
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Sequence[float] | None) -> None:
        self.planned.pop(trial.number, None)
        self.fallback.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.fallback.reseed_rng()


class Seen:
    """What the study's trials tried or are about to, and how each configuration scored (lower is better;
    a failed, pruned or infeasible one scores infinity)."""

    def __init__(self, space: SearchSpace, trials: Sequence[FrozenTrial],
                 directions: Sequence[StudyDirection] = (StudyDirection.MINIMIZE,),
                 planned: dict[int, Knobs] | None = None) -> None:
        self.space = space
        self.tried: set[str] = set()
        self.scores: dict[str, float] = {}
        for t in trials:
            key = TrialRecord.of(t).identity or self.promised(t, planned or {})
            if key is None:
                continue  # asked, not yet sampled, and free to be anything (this very trial)
            self.tried.add(key)
            if t.state.is_finished():
                self.scores[key] = min(self.scores.get(key, math.inf), score(t, directions[0]))

    def key(self, flat: Flat) -> str:
        return identity(TrialConfig.from_flat(flat, self.space.env), self.space.env)

    def promised(self, trial: FrozenTrial, planned: dict[int, Knobs]) -> str | None:
        """The configuration a trial that has not sampled yet will take: queued params (``enqueue_trial``
        keeps them in the ``fixed_params`` system attribute, waiting or asked) or this sampler's plan."""
        params = trial.system_attrs.get("fixed_params") or planned.get(trial.number)
        flat = self.space.configuration(params) if params else None
        return self.key(flat) if flat is not None else None


def score(trial: FrozenTrial, direction: StudyDirection) -> float:
    """The trial's first objective, lower is better; infinity without a feasible value."""
    if trial.state != TrialState.COMPLETE or not trial.values or not feasible(trial):
        return math.inf
    return -trial.values[0] if direction == StudyDirection.MAXIMIZE else trial.values[0]


def every(space: SearchSpace, seed: int) -> Plan:
    """Each configuration of the space once, in a seeded random order."""
    order = space.configurations()
    random.Random(seed).shuffle(order)

    def plan(seen: Seen) -> Flat | None:
        return next((flat for flat in order if seen.key(flat) not in seen.tried), None)

    return plan


LEAD_SCOPES = ("none", "module", "regional", "train_step")
"""What a practitioner tries first, in this order: no compile, ``torch.compile(model)``, regional compile
(the first three are the queued baselines) and the compiled train step."""


def staged(space: SearchSpace, seed: int = 0, margin: float = PRIOR_ALONE_NOISE) -> Plan:
    """The lead scopes in the lead precision; the shared knobs on the best eager and the best compiled lead
    (:func:`shared_order`); then each compiled knob from the best compiled program, one at a time.

    ``seed`` orders the knobs within each stage (a knob's alternatives are measured from the incumbent as
    it stands when its turn comes, so the order decides the path): seeds explore different paths rather
    than agree by construction. ``margin``: see :func:`descend`."""
    rng = random.Random(seed)
    shared = list(SHARED)
    rng.shuffle(shared)
    compiled = [key for key in DEFAULTS if key not in SHARED and key != "compile.scope"]
    rng.shuffle(compiled)
    leads = lead_programs(space)

    def plan(seen: Seen) -> Flat | None:
        for lead in leads:
            if seen.key(lead) not in seen.tried:
                return lead
        finished = [lead for lead in leads if seen.key(lead) in seen.scores]
        if not finished:
            return None  # every lead program still runs elsewhere: the fallback sampler's turn
        # While one still runs (another slot), the plan goes on from the best finished so far.
        order = shared_order(finished, lambda c: seen.scores[seen.key(c)])
        settled: list[Flat] = []
        for start in order:
            following, best = descend(seen, start, shared, margin)
            if following is not None or best is None:
                return following
            settled.append(best)
        start = next((c for c in settled if not eager(c)), None)
        if start is None:
            return None
        following, _ = descend(seen, start, compiled, margin)
        return following

    return plan


def eager(flat: Flat) -> bool:
    return not compiles(flat["compile.scope"])


SHARED_REACH = 0.30
"""How much the shared knobs have moved a program's time to train in the records: the suite's eager winners
stepped 5-24 % faster than plain eager (fused AdamW; ``benchmarks/results/cpu-2core/suite/suite.md``), and
bf16 autocast took eager GPT-2 from 104k to 141k tokens/s on an H200 (-26 % a step; docs/benchmarks.md).
An eager lead further behind the leader than this is not worth its shared descent before the compiled one."""


def shared_order(finished: list[Flat], score: Callable[[Flat], float]) -> list[Flat]:
    """Where the shared knobs are settled, in order: the best eager lead and the best compiled lead. Eager
    first when it leads or is within :data:`SHARED_REACH` of the leader (its runs cost no compile: on a CPU,
    where fused AdamW on eager often wins, they find it soonest); the compiled one first when eager is out of
    reach (on a GPU, compiled bf16 steps 2-3x faster than eager: its precision and optimizer come first)."""
    best_eager = min((c for c in finished if eager(c)), key=score, default=None)
    best_compiled = min((c for c in finished if not eager(c)), key=score, default=None)
    if best_eager is None or best_compiled is None:
        return [c for c in (best_eager, best_compiled) if c is not None]
    leader = min(score(best_eager), score(best_compiled))
    if score(best_eager) <= leader + SHARED_REACH * abs(leader):
        return [best_eager, best_compiled]
    return [best_compiled, best_eager]


def lead_programs(space: SearchSpace) -> list[Flat]:
    """The :data:`LEAD_SCOPES` the space offers, each at the search's start (defaults, lead values, fixed knobs)."""
    leads = []
    for scope in LEAD_SCOPES:
        flat = space.start(**{"compile.scope": scope})
        if flat["compile.scope"] == scope and flat not in leads:
            leads.append(flat)
    return leads or [space.start()]


def eager_runs_left(space: SearchSpace, trials: Sequence[FrozenTrial]) -> int:
    """How many eager runs ``staged`` has still to make: its eager lead and each other value of each
    shared knob on it, less those tried or queued (the estimate prices them at the eager cost)."""
    seen = Seen(space, trials)
    start = space.start(**{"compile.scope": "none"})
    if not eager(start):
        return 0
    planned = 1 + sum(len(space.options(key, start)) - 1 for key in SHARED)
    done = sum(1 for key in seen.tried if "compile.scope='none'" in key)
    return max(planned - done, 0)


def descend(seen: Seen, start: Flat, keys: Sequence[str],
            margin: float = PRIOR_ALONE_NOISE) -> tuple[Flat | None, Flat | None]:
    """One pass of coordinate descent from ``start`` over ``keys``: the first configuration of the pass not
    yet tried, or (None, the pass's best) once every one is measured; (None, None) while some still run.

    A change is taken only when its measurement beats the incumbent's by more than ``margin`` (relative,
    :func:`kept`). Each is one alone process, and the tuner answers a configuration asked again with its
    first measurement (``tuner.run_trial``: ``duplicate_of``), so a near tie cannot be re-measured here:
    the incumbent, the simpler program (fewer knobs changed on this path), is kept. The default margin is
    the prior noise of one alone process (``decisions.PRIOR_ALONE_NOISE``, 8.6 %): a change with no
    effect is then kept about 24 % of the time per alternative (a difference of two alone processes has
    sd sqrt(2) x 8.6 %), against about 50 % when any better-looking value wins. The confirmation, not
    this pass, decides between the programs it measured.

    A candidate still running elsewhere (another slot or tuner) does not hold the pass up: the pass goes
    on from the incumbent as it stands, and its best is only final once every candidate finished."""
    space = seen.space
    incumbent, pending = start, False
    for key in keys:
        choices = space.options(key, incumbent)
        if len(choices) < 2:
            continue
        candidates = [space.normalised({**incumbent, key: value}) for value in choices]
        for candidate in candidates:
            if seen.key(candidate) not in seen.tried:
                return candidate, None
        finished = [c for c in candidates if seen.key(c) in seen.scores]
        pending = pending or len(finished) < len(candidates)
        if seen.key(incumbent) in seen.scores:
            challenger = min(finished, key=lambda c: seen.scores[seen.key(c)])
            if kept(seen.scores[seen.key(challenger)], seen.scores[seen.key(incumbent)], margin):
                incumbent = challenger
    return None, None if pending else incumbent


def kept(challenger: float, incumbent: float, margin: float) -> bool:
    """A one-knob change replaces the incumbent: it scored lower (better) by more than ``margin``
    of the incumbent's magnitude); a near tie keeps the incumbent. Lower is better: a time, or minus a
    throughput; infinity: failed, pruned or infeasible."""
    if math.isinf(challenger):
        return False
    if math.isinf(incumbent):
        return True
    return challenger < incumbent - margin * abs(incumbent)
