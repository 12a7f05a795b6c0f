"""A search strategy replayed against a table of measured programs: the tabular benchmark's simulator.

The table (``scripts/program_table.py``) holds every configuration of a space measured once on a quiet
machine: its step time, cold compile time and the trial's wall time. A replay runs the real sampler
(:func:`autocompile.study.samplers.make_sampler`) on an in-memory study over the same space, queues the
same baselines a study queues, and answers each trial from its row with noise drawn from the measured
noise floor; a configuration asked again is answered as the tuner answers it (its first measurement,
no cost). After each trial it notes the simulated wall clock and the *true* time to train of what
the study would recommend if it stopped there: the confirmation's pick among the search's best
``confirm_top`` configurations (by their noisy single measurements) and the baselines measured, each
timed again side by side with the confirmation's much smaller noise (``Noise.confirm``). The
confirmation's own wall time is the same for every strategy and is not counted.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import optuna
from optuna.trial import TrialState

from autocompile.config.knobs import describe
from autocompile.config.space import SearchSpace, identity
from autocompile.study.objective import time_to_train
from autocompile.study.record import set_attrs
from autocompile.study.tuner import queue_baselines


@dataclass(frozen=True)
class Row:
    """One configuration as the table measured it."""

    identity: str
    ok: bool
    step_s: float
    compile_s: float
    wall_s: float
    """The trial's wall seconds, process start to result: what measuring it costs a study."""


@dataclass(frozen=True)
class Noise:
    """Relative spread of one fresh-process measurement (lognormal sigma)."""

    step: float = 0.043
    """Step time, process to process: 4.3 % on the quiet 2-core VM (DESIGN.md, five fresh processes)."""
    compile: float = 0.035
    """Cold compile time: 19.4-20.7 s over three fresh processes (bench_trial_gpt2-tiny.txt)."""
    confirm: float = 0.007
    """A candidate's mean step time in the side-by-side confirmation: the A/A comparison's 95 % half-width
    was 1.39 % (compare_aa_gpt2-tiny.txt), a standard deviation of about 0.7 %."""


@dataclass
class Replay:
    """One simulated study, trial by trial."""

    wall_s: list[float] = field(default_factory=list)
    """Simulated wall clock after each trial (the sum of the trials' wall times)."""
    recommended_s: list[float] = field(default_factory=list)
    """True time to train of the configuration the study would recommend after each trial (inf: none yet)."""

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
                                   float(r["wall_s"] or "nan")) for r in csv.DictReader(f)}


def best_time_to_train(table: dict[str, Row], horizon_steps: int) -> float:
    return min(time_to_train(r.compile_s, r.step_s, horizon_steps) for r in table.values() if r.ok)


def replay(space: SearchSpace, table: dict[str, Row], sampler: optuna.samplers.BaseSampler, n_trials: int,
           horizon_steps: int, noise: Noise, seed: int, baselines: bool = True, confirm_top: int = 3) -> Replay:
    """Run ``sampler`` for ``n_trials`` trials against ``table``; noise seeded by ``seed``."""
    rng = np.random.default_rng(seed)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if baselines:
        queue_baselines(study, space)
    told: dict[str, float | None] = {}  # identity -> value told (None: failed)
    confirmed: dict[str, float] = {}  # identity -> time to train as the confirmation would measure it
    queued: set[str] = set()  # the baselines' identities: the confirmation always has them
    out, wall = Replay(), 0.0
    for _ in range(n_trials):
        trial = study.ask()
        config = space.sample(trial)
        key = identity(config, space.env)
        set_attrs(trial, config=config.active(space.env), identity=key, name=describe(config, space.env))
        row = table.get(key)
        if row is None:
            raise KeyError(f"the table has no row for {key}: was it measured on another space?")
        if trial.user_attrs.get("baseline"):
            queued.add(key)
        if key not in told:
            wall += row.wall_s
            told[key] = None
            if row.ok:
                true_s = time_to_train(row.compile_s, row.step_s, horizon_steps)
                told[key] = time_to_train(row.compile_s * math.exp(rng.normal(0.0, noise.compile)),
                                          row.step_s * math.exp(rng.normal(0.0, noise.step)), horizon_steps)
                confirmed[key] = true_s * math.exp(rng.normal(0.0, noise.confirm))
        value = told[key]
        if value is None:
            study.tell(trial, state=TrialState.FAIL)
        else:
            study.tell(trial, value)
        out.wall_s.append(wall)
        out.recommended_s.append(recommended(table, told, confirmed, queued, confirm_top, horizon_steps))
    return out


def recommended(table: dict[str, Row], told: dict[str, float | None], confirmed: dict[str, float],
                baselines: set[str], confirm_top: int, horizon_steps: int) -> float:
    """True time to train of the confirmation's pick: the best by its measurement among the search's top
    ``confirm_top`` and the baselines (the search's best alone when ``confirm_top`` is 0); inf: none yet."""
    measured = sorted((v, k) for k, v in told.items() if v is not None)
    if not measured:
        return math.inf
    candidates = {k for _, k in measured[:max(confirm_top, 1)]}
    if confirm_top:
        candidates |= {k for k in baselines if k in confirmed}
    pick = min(candidates, key=lambda k: confirmed[k]) if confirm_top else measured[0][1]
    row = table[pick]
    return time_to_train(row.compile_s, row.step_s, horizon_steps)
