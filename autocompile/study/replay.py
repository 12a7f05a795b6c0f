"""A search strategy replayed against a table of measured programs, by the tuner's own rules.

The table (``scripts/program_table.py``, any model) holds every configuration of a space measured once on
a quiet machine: its step time, cold compile time and the trial's wall time. A replay runs the real
sampler (:func:`autocompile.study.search.samplers.make_sampler`) on an in-memory study over the same space,
queues the same baselines a study queues, and answers each trial from its row as the tuner would:

- **Measurement**: one alone process per trial, its step time and cold compile drawn with the noise the
  records show (:class:`Noise`); a configuration asked again is answered with its first measurement (the
  tuner's ``duplicate_of``), at no cost.
- **Pruning** (``study.prune``, on by default): the tuner's own stop rule
  (:meth:`autocompile.study.records.objective.Objective.stop_rule`, with the tuner's arguments: the best complete
  trial so far, the prior alone noise since a search measures no configuration twice, ``k`` = the complete
  trials) is called on the events the trial's first timed window would send. A pruned trial is told
  PRUNED, never reaches the confirmation, and costs its row's whole wall time (the first window comes
  after the warm-up, the bulk of a trial's wall time on these tables). The rule's evidence (ratio, margin)
  is kept on the trial as the tuner keeps it.
- **Provisional prunes** (``study.remeasure_pruned``): after the ``n_trials`` trials, the near misses
  :func:`autocompile.study.records.objective.near_misses` picks from the in-memory study are measured once more as
  search trials beyond ``n_trials`` (fresh noise, their wall time counted), pruned again by the same rule
  against the best of the whole search, or complete and reach the confirmation.
- **Confirmation** (``study.confirm_top``): the search's best ``confirm_top`` distinct programs (by their
  noisy single measurements, distinct by fingerprint) and the eager and default-compile baselines are
  timed again in ``Noise.processes`` processes (each process a shared level, each candidate its own
  per-process noise ``Noise.confirm``), each with the compile time *its search trial measured* (not the
  true one), and raced by :func:`autocompile.study.phases.confirmation.versus` and
  :func:`autocompile.study.statistics.decisions.race`:
  the leader by mean log score, the winner the simplest (:func:`autocompile.study.phases.racing.simplicity`)
  among those tied within ``objective.tie_margin``; undetermined ones are not recommended over the leader.

After each trial it notes the simulated wall clock and the *true* time to train of what the study would
recommend if it stopped there. The confirmation's own wall time is the same for every strategy and is not
counted.
"""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from autocompile.config.choices import Knobs
from autocompile.config.knobs import describe
from autocompile.config.sections import ObjectiveSettings, StudySettings
from autocompile.config.space import SearchSpace, identity
from autocompile.study.phases.confirmation import Candidate, versus
from autocompile.study.phases.racing import simplicity
from autocompile.study.records.compile_prior import class_prior
from autocompile.study.records.objective import Objective, near_misses, time_to_train
from autocompile.study.records.record import Measurement, set_attrs
from autocompile.study.search.baselines import queue_baselines
from autocompile.study.statistics.decisions import PRIOR_ALONE_NOISE, PRUNE_WINDOWS, race
from autocompile.trial.timing.result import ProgressEvent

WARMUP_STEPS = 3
"""Warm-up steps before the first timed window (the workers' default burst: 3 warm-up + 5 x 5 timed)."""


@dataclass(frozen=True)
class Row:
    """One configuration as the table measured it."""

    identity: str
    ok: bool
    step_s: float
    compile_s: float
    wall_s: float
    """The trial's wall seconds, process start to result: what measuring it costs a study."""
    fingerprint: str = ""
    """The compiled program's fingerprint: the confirmation races distinct programs (empty: a program of its
    own, as a table without fingerprints is read)."""


@dataclass(frozen=True)
class Noise:
    """Relative spread (lognormal sigma) of what one measurement reads, from the committed records of the
    2-core CPU VM (benchmarks/results/cpu-2core/)."""

    step: float = PRIOR_ALONE_NOISE
    """Step time of one alone fresh process: 8.6 %, the largest run-to-run noise issue 26's studies
    recorded (6.7-8.6 %; ``decisions.PRIOR_ALONE_NOISE``). bench_trial_gpt2-tiny.txt: 6.7 % (default
    compile) and 7.5 % (eager) over three processes; bench_trial_gpt2-tiny_rerun.txt: 16.3 %."""
    compile: float = 0.05
    """Cold compile time across fresh processes: 19.36 / 19.61 / 20.73 s (3.6 %, bench_trial_gpt2-tiny.txt)
    and 22.00 / 21.99 / 23.80 s (4.6 %, bench_trial_gpt2-tiny_rerun.txt); issue 26: 3.6-6.3 %."""
    confirm: float = 0.008
    """One candidate's mean step time within one side-by-side process, relative to the process's level:
    the A/A comparison's 95 % half-width +-1.4 % over 5 processes (compare_aa_gpt2-tiny.txt) is a
    per-process log-ratio sd of 1.4 / t(4) x sqrt(5) = 1.1 %, 0.8 % per candidate."""
    window: float = 0.06
    """The first timed window against the process's step time (what pruning reads): the window CV of
    bench_trial_gpt2-tiny*.txt, medians 5.7-7.9 %."""
    processes: int = 7
    """Processes of the side-by-side confirmation (``compare.processes``, default 7; the replays recorded
    before that default ran with 5)."""


@dataclass
class Replay:
    """One simulated study, trial by trial."""

    wall_s: list[float] = field(default_factory=list)
    """Simulated wall clock after each trial (the sum of the trials' wall times)."""
    recommended_s: list[float] = field(default_factory=list)
    """True time to train of the configuration the study would recommend after each trial (inf: none yet)."""
    states: list[tuple[str, TrialState]] = field(default_factory=list)
    """Each of the ``n_trials`` trials' configuration and how it ended (COMPLETE, PRUNED, FAIL; a repeat as its
    first)."""
    remeasured: list[tuple[str, TrialState]] = field(default_factory=list)
    """The near-miss prunes measured once more after them (their wall and recommendation follow the
    ``n_trials`` entries of ``wall_s`` and ``recommended_s``): COMPLETE (recovered) or PRUNED again."""

    def first_within(self, best_s: float, tolerance: float) -> tuple[int, float] | None:
        """(trials, wall seconds) until the recommendation stays within ``tolerance`` of ``best_s``; None: never."""
        found = None
        for i, value in enumerate(self.recommended_s):
            # A noisy, better-looking program can take the recommendation away again: then it starts over.
            found = (found or (i + 1, self.wall_s[i])) if value <= best_s * (1 + tolerance) else None
        return found


def load_table(path: Path) -> dict[str, Row]:
    """The table's rows by configuration identity."""
    with path.open() as f:
        return {r["identity"]: Row(r["identity"], r["status"] == "ok" and bool(r["step_ms"]),
                                   float(r["step_ms"] or "nan") / 1e3, float(r["compile_s"] or "nan"),
                                   float(r["wall_s"] or "nan"), r.get("fingerprint") or r["identity"])
                for r in csv.DictReader(f)}


def best_time_to_train(table: dict[str, Row], horizon_steps: int) -> float:
    return min(time_to_train(r.compile_s, r.step_s, horizon_steps) for r in table.values() if r.ok)


@dataclass
class Told:
    """One configuration's search trial, as the study recorded it."""

    state: TrialState
    config: Knobs
    baseline: str | None
    fingerprint: str
    measured: Measurement | None = None
    """Step and compile time its one alone process read (None: failed)."""
    confirm_steps: dict[int, float] = field(default_factory=dict)
    """Its step time in each confirmation process, drawn when it was first measured."""
    evidence: dict[str, float] = field(default_factory=dict)
    """Pruned: the stop rule's evidence (``ratio``, ``margin``), as the tuner records it on the trial."""

    def score(self, horizon: int) -> float:
        m = self.measured
        if self.state != TrialState.COMPLETE or m is None or m.step_s is None or m.compile_s is None:
            return math.inf
        return time_to_train(m.compile_s, m.step_s, horizon)


def first_window_events(compile_s: float, window_step_s: float) -> list[ProgressEvent]:
    """The launcher's events up to a trial's first timed windows (``decisions.PRUNE_WINDOWS``, each at
    ``window_step_s``, their median): what the stop rule reads (the warm-up's first step carries the compile)."""
    warm = [compile_s + window_step_s] + [window_step_s] * (WARMUP_STEPS - 1)
    return [ProgressEvent(event="warmup_start", time=0.0),
            *(ProgressEvent(event="warmup_step", seconds=w) for w in warm),
            *(ProgressEvent(event="window", step_s=window_step_s) for _ in range(PRUNE_WINDOWS))]


def pruned_by_tuner(objective: Objective, told: dict[str, Told], compile_s: float, window_step_s: float,
                    horizon: int) -> dict[str, float] | None:
    """The tuner's stop rule, built as ``tuner.run_trial`` builds it, after this trial's first window: against
    the best complete trial so far, the prior alone noise (a search repeats nothing, so ``study_noise`` has
    nothing to pool), ``k`` = the complete trials. Pruned: the rule's evidence (``ratio``, ``margin``); None:
    it goes on."""
    scored = [(i, t.measured) for i, t in enumerate(told.values())
              if t.measured is not None and t.state == TrialState.COMPLETE]
    best = min(scored, key=lambda s: time_to_train(s[1].compile_s, s[1].step_s, horizon), default=None)
    rule = objective.stop_rule(best, None, len(scored))
    if rule is None or rule(first_window_events(compile_s, window_step_s), 0.0) is None:
        return None
    return dict(rule.evidence)


def replay(space: SearchSpace, table: dict[str, Row], sampler: optuna.samplers.BaseSampler, n_trials: int,
           horizon_steps: int, noise: Noise, seed: int, baselines: bool = True, confirm_top: int = 3,
           prune: bool = True, tie_margin: float | None = None,
           remeasure_pruned: int = StudySettings.remeasure_pruned) -> Replay:
    """Run ``sampler`` for ``n_trials`` trials against ``table``, then measure the near-miss prunes once more;
    noise seeded by ``seed``. ``prune``: as ``study.prune``; ``tie_margin``: ``objective.tie_margin`` (None:
    its default); ``remeasure_pruned``: as ``study.remeasure_pruned``."""
    rng = np.random.default_rng(seed)
    settings = ObjectiveSettings(horizon_steps=horizon_steps)
    if tie_margin is not None:
        settings.tie_margin = tie_margin
    objective = Objective(settings)
    levels = rng.normal(0.0, noise.step, noise.processes)  # each confirmation process's own speed
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if baselines:
        queue_baselines(study, space)
    told: dict[str, Told] = {}
    out, wall = Replay(), 0.0
    for _ in range(n_trials):
        trial = study.ask()
        key, state, wall = answer(study, trial, space, table, told, objective, noise, rng, prune, wall)
        out.wall_s.append(wall)
        out.states.append((key, state))
        out.recommended_s.append(recommended(table, told, objective, confirm_top, levels))
    # Then as ``tuner.Runner.remeasure``: the near misses queued again, each a search trial with fresh noise.
    for t in near_misses(study.get_trials(deepcopy=False), remeasure_pruned) if prune else []:
        study.enqueue_trial(t.params, user_attrs={"remeasure_of": t.number})
        key, state, wall = answer(study, study.ask(), space, table, told, objective, noise, rng, prune, wall)
        out.wall_s.append(wall)
        out.remeasured.append((key, state))
        out.recommended_s.append(recommended(table, told, objective, confirm_top, levels))
    return out


def answer(study: optuna.Study, trial: optuna.Trial, space: SearchSpace, table: dict[str, Row],
           told: dict[str, Told], objective: Objective, noise: Noise, rng: np.random.Generator, prune: bool,
           wall: float) -> tuple[str, TrialState, float]:
    """Answer one search trial from its row and tell the study: (its configuration, its state, the wall clock
    after it). A configuration measured before answers with that measurement, at no cost, unless the trial
    re-measures a near-miss prune."""
    config = space.sample(trial)
    key = identity(config, space.env)
    active = config.active(space.env)
    set_attrs(trial, config=active, identity=key, name=describe(config, space.env))
    row = table.get(key)
    if row is None:
        raise KeyError(f"the table has no row for {key}: was it measured on another space?")
    if key not in told or trial.user_attrs.get("remeasure_of") is not None:
        wall += row.wall_s
        told[key] = measure(objective, told, row, active, trial.user_attrs.get("baseline"), noise, rng,
                            objective.settings.horizon_steps, prune)
        if told[key].evidence:  # as ``measuring`` records it: what ``near_misses`` reads
            set_attrs(trial, prune_ratio=told[key].evidence["ratio"], prune_margin=told[key].evidence["margin"])
    t = told[key]
    if t.state == TrialState.COMPLETE:
        study.tell(trial, t.score(objective.settings.horizon_steps))
    else:
        study.tell(trial, state=t.state)
    return key, t.state, wall


def measure(objective: Objective, told: dict[str, Told], row: Row, config: Knobs, baseline: str | None,
            noise: Noise, rng: np.random.Generator, horizon: int, prune: bool) -> Told:
    """One search trial of ``row``: failed, pruned by the tuner's rule, or its noisy measurement."""
    if not row.ok:
        return Told(TrialState.FAIL, config, baseline, row.fingerprint)
    step = row.step_s * math.exp(rng.normal(0.0, noise.step))
    compile_s = row.compile_s * math.exp(rng.normal(0.0, noise.compile))
    window = step * math.exp(rng.normal(0.0, noise.window))
    confirm = {r: row.step_s * math.exp(rng.normal(0.0, noise.confirm)) for r in range(noise.processes)}
    if prune and baseline is None and (evidence := pruned_by_tuner(objective, told, compile_s, window, horizon)):
        return Told(TrialState.PRUNED, config, baseline, row.fingerprint, confirm_steps=confirm, evidence=evidence)
    measured = Measurement(status="ok", step_s=step, compile_s=compile_s, step_s_cv=noise.window)
    return Told(TrialState.COMPLETE, config, baseline, row.fingerprint, measured, confirm)


def confirmation(told: dict[str, Told], confirm_top: int, horizon: int) -> list[str]:
    """The configurations ``confirm.confirm_plan`` races: the best ``confirm_top`` distinct programs by their
    single measurements, and the eager and default-compile baselines."""
    ranked = sorted((t.score(horizon), k) for k, t in told.items() if t.state == TrialState.COMPLETE)
    chosen: list[str] = []
    programs: set[str] = set()
    for _, k in ranked:
        program = told[k].fingerprint or k
        if len(chosen) < confirm_top and program not in programs:
            chosen.append(k)
            programs.add(program)
    chosen += [k for _, k in ranked if told[k].baseline in ("eager", "compile") and k not in chosen]
    return chosen


def recommended(table: dict[str, Row], told: dict[str, Told], objective: Objective, confirm_top: int,
                levels: np.ndarray) -> float:
    """True time to train of what the study recommends: the confirmation's winner (the search's best single
    measurement when ``confirm_top`` is 0 or fewer than two candidates); inf: none yet."""
    horizon = objective.settings.horizon_steps
    ranked = sorted((t.score(horizon), k) for k, t in told.items() if t.state == TrialState.COMPLETE)
    if not ranked:
        return math.inf
    pick = ranked[0][1]
    keys = confirmation(told, confirm_top, horizon) if confirm_top else []
    if len(keys) >= 2:
        raced = [Candidate(k, i, k, told[k].config, told[k].baseline, told[k].measured.compile_s or 0.0,
                           {r: s * math.exp(levels[r]) for r, s in told[k].confirm_steps.items()})
                 for i, k in enumerate(keys) if told[k].measured is not None]
        spread = class_prior("cpu", objective.settings)  # the replays' tables were measured on the 2-core VM
        decision = race([statistics.fmean(math.log(s) for s in c.scores(objective).values()) for c in raced],
                        [simplicity(c.config) for c in raced],
                        lambda i, j: versus(raced[i], raced[j], objective, True, spread), objective.settings.tie_margin)
        pick = raced[decision.winner].label
    row = table[pick]
    return time_to_train(row.compile_s, row.step_s, horizon)
