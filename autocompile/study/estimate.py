"""What a study will cost on this machine, said before anything long starts and refined as it runs.

One run of a configuration costs about what the numerics reference cost (process start, imports,
model build, warm-up, timed part: its wall time) plus, when it compiles, the compile time: measured
by the study's own compiled trials once there are some, before that estimated from the model's
size. The search is ``study.n_trials`` such runs (the queued baselines included; a sampled trial is
eager as often as ``compile.scope=none`` is among the scopes), the phases after it are their plans
(:func:`autocompile.study.phase_costs.phase_costs`, the one place that reads how the phases run) around the winner,
and the
winner's warm start one more run. Until the search has measured a winner, the phases are priced at a
stand-in (:func:`stand_in`): the best trial so far, or before any, the baseline the reference and
the compile prior say would win.
"""

from __future__ import annotations

import logging
import math
import os
import statistics
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import compiles
from autocompile.config.knobs import KNOBS, TrialConfig
from autocompile.config.settings import Settings
from autocompile.config.space import BASELINES, SearchSpace
from autocompile.study.phase_costs import RunCosts, phase_costs, trial_compiles
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import (
    EXPECTED,
    FINISHED,
    IN_FLIGHT,
    REFERENCE,
    WARM_START,
    counted,
    measured_trials,
)
from autocompile.study.reuse import reverifies
from autocompile.study.search.samplers import eager_runs_left

log = logging.getLogger(__name__)

COMPILE_S_PER_MODULE = 0.8
"""Cold inductor compile per module of the model (gpt2-tiny: 25 modules, 19.7 s on the 2-core CPU of
benchmarks/results/cpu-2core): the prior until the study's first compiled trial measures it."""
BACKEND_SHARE = {"inductor": 1.0, "aot_eager": 0.08, "eager": 0.03}
"""A backend's compile time relative to inductor's (aot_eager: 1-2 s where inductor takes 20 s)."""
WARM_COMPILE_SHARE = 0.15
"""What is left of a compile with a warm inductor cache (2.8 s of 23 s cold, DESIGN.md section 4)."""
BOOKKEEPING_S = 1.0
"""Per run, the tuner's own work around it: Optuna, MLflow logging."""
EXPECTED_STEP_GAIN = 0.10
"""Before any trial, how much faster compiled steps are assumed to be, to guess whether the winner
compiles (eager vs default compile on gpt2-tiny, 2-core CPU: 11-13 % faster steps,
benchmarks/results/cpu-2core/compare_eager_vs_compile_run*.txt)."""
HINT = "study.n_trials, study.verdicts and measure.max_timed_s trade it down"
CPU_PER_PROCESS = 1.3
"""Cores a trial process keeps busy outside its timed windows, on average over its start, imports, build and compile
(inductor compiles kernels in worker processes): what bounds how many processes in flight overlap usefully on a
machine's cores. Measured on the 2-core VM: a lone compile's CPU seconds per wall second, 1.17-1.25 over the default
gpt2-tiny study's compiles (benchmarks/results/cpu-2core/issue51/README.md)."""


@dataclass
class StudyEstimate:
    """The study's expected wall time, by part."""

    search_s: float
    """The search trials still to run."""
    confirm_s: float
    """The confirmation phase."""
    verdict_s: float
    """The verdict phase."""
    warm_start_s: float
    """The winner's warm-start measurement."""
    trials_left: int
    """Search trials still to run."""
    costs: RunCosts
    """The per-run costs behind it."""
    in_flight: int = 1
    """Search processes in flight at once (``launch.concurrency``): their timed parts one after another."""

    @property
    def total_s(self) -> float:
        return self.search_s + self.confirm_s + self.verdict_s + self.warm_start_s

    def parts(self) -> dict[str, float]:
        """Seconds per part still to run, as the study keeps them (``EXPECTED``) and the report compares them."""
        return {"search": self.search_s, "confirm": self.confirm_s, "verdict": self.verdict_s,
                "warm_start": self.warm_start_s, "total": self.total_s}

    def line(self) -> str:
        """``about 2 h 40 min on this machine: search ~1 h 50 min (20 trials), ...``."""
        flight = f", {self.in_flight} in flight" if self.in_flight > 1 else ""
        parts = [f"search ~{duration(self.search_s)} ({self.trials_left} trials at ~{duration(self.costs.cold_s)} "
                 f"each{flight}, {self.costs.basis})"]
        parts += [f"{name} ~{duration(s)}" for name, s in (("confirmation", self.confirm_s),
                                                           ("verdicts", self.verdict_s),
                                                           ("warm start", self.warm_start_s)) if s]
        return f"about {duration(self.total_s)} on this machine: {', '.join(parts)}; {HINT}"


def duration(seconds: float) -> str:
    """``45 s``, ``12 min``, ``2 h 40 min``."""
    if not math.isfinite(seconds):
        return "?"
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


GUESSED_MODULES = 25
"""Leaf modules assumed where the model cannot be counted before the study runs (a script's)."""


def compile_prior_s(settings: Settings) -> tuple[float, str]:
    """Cold compile time before anything was compiled: modules of the model x a measured rate."""
    import torch

    from autocompile.workload.models import build

    backend = settings.fixed_knobs.get("compile.backend", KNOBS["compile.backend"][1])
    if settings.fixed_knobs.get("compile.scope") == "none":
        return 0.0, "nothing compiled"
    if settings.script.given:
        modules, basis = GUESSED_MODULES, (f"compile estimated for {GUESSED_MODULES} modules (a script's model is "
                                           "not built before it runs)")
    else:
        try:
            with torch.device("meta"):  # no memory, no init: only the module count is read
                modules = sum(1 for m in build(settings.model.target, settings.model.kwargs).modules()
                              if not list(m.children()))
            basis = f"compile estimated from the model's {modules} modules"
        except Exception:  # noqa: BLE001 - user code; the estimate still stands on the reference
            modules, basis = GUESSED_MODULES, (f"compile estimated for {GUESSED_MODULES} modules (the model could "
                                               "not be built on the meta device)")
    return modules * COMPILE_S_PER_MODULE * BACKEND_SHARE.get(backend, 1.0), basis


def baseline(space: SearchSpace, name: str) -> SimpleNamespace:
    """A queued baseline's configuration, shaped like a trial (the fixed knobs win over it)."""
    config = TrialConfig.from_flat(space.start(**BASELINES[name]), space.env, strict=False)
    return SimpleNamespace(user_attrs={"config": config.active(space.env)}, number=None)


def stand_in(study: optuna.Study, space: SearchSpace, objective: Objective, costs: RunCosts) -> Any:
    """The winner the phases are priced at: the confirmed winner or the search's best so far; before any
    trial, the eager baseline when the compile would not pay back over the horizon at
    :data:`EXPECTED_STEP_GAIN` faster steps, else the default compile."""
    from autocompile.study.phases.plans import winner_trial

    best = winner_trial(study, objective)
    if best is not None:
        return best
    step_s = (study.user_attrs.get(REFERENCE) or {}).get("step_s")
    horizon = objective.settings.horizon_steps
    pays_back = (objective.settings.kind != "time_to_train" or not step_s
                 or costs.cold_s - costs.eager_s < horizon * step_s * EXPECTED_STEP_GAIN)
    return baseline(space, "compile" if pays_back else "eager")


def run_costs(study: optuna.Study, settings: Settings, prior: tuple[float, str]) -> RunCosts | None:
    """Per-run costs from the study's own trials where it has them, else the reference and ``prior``.

    A run times its windows until its precision or ``measure.max_timed_s``: the reference's timed part is one draw
    of that (2 s of 18 windows or the whole 10 s on the 2-core VM), so before any eager trial a run is the reference
    less its timed part, plus the cap most trials there reach."""
    measured = [t for t in measured_trials(study) if "wall_s" in t.user_attrs["result"]]
    ref = study.user_attrs.get(REFERENCE) or {}
    eager = [t.user_attrs["result"] for t in measured if not trial_compiles(t)]
    cap = settings.measure.max_timed_s
    # What a run's timed part will take: up to the cap, or one window for a re-verification's brief runs.
    timed_next = settings.measure.window_steps * ref["step_s"] if reverifies(study) and ref.get("step_s") else cap
    starts = [r["wall_s"] - r["timed_s"] for r in eager if r.get("timed_s") is not None]
    start_s = statistics.median(starts) if starts else None
    eager_s = statistics.median(r["wall_s"] for r in eager) if eager else None
    if eager_s is None and ref.get("wall_s") is not None:
        timed = ref["windows"] * settings.measure.window_steps * ref["step_s"] if ref.get("windows") and \
            ref.get("step_s") else None
        start_s = ref["wall_s"] - min(timed, cap) if timed is not None else None
        eager_s = start_s + timed_next if start_s is not None else ref["wall_s"]
    cold = [t.user_attrs["result"] for t in measured if trial_compiles(t)]
    if cold:
        # Pruned and failed trials included: the next trials will be stopped about as often.
        cold_s = statistics.median(r["wall_s"] for r in cold)
        ok = [r["compile_s"] for r in cold if r.get("status") == "ok"]
        compile_s = statistics.median(ok) if ok else cold_s - (eager_s or 0.0)
        eager_s = eager_s if eager_s is not None else max(cold_s - compile_s, 1.0)
        basis = f"measured on {len(cold)} compiled trial(s)"
    elif eager_s is not None:
        compile_s, basis = prior
        cold_s = eager_s + compile_s
    else:
        return None  # no reference yet
    return RunCosts(eager_s=eager_s + BOOKKEEPING_S, cold_s=cold_s + BOOKKEEPING_S,
                    warm_s=eager_s + WARM_COMPILE_SHARE * compile_s + BOOKKEEPING_S, basis=basis,
                    start_s=start_s + BOOKKEEPING_S if start_s is not None else None)


def search_left_s(study: optuna.Study, space: SearchSpace, settings: Settings,
                  costs: RunCosts) -> tuple[float, int]:
    """Seconds and number of the search trials still to run: queued baselines at their own cost, a sampled
    trial at the eager cost as often as ``compile.scope=none`` is among the scopes it is drawn from (``staged``:
    its eager runs at the eager cost, the rest compiled)."""
    trials = study.get_trials(deepcopy=False)
    left = max(settings.study.n_trials - sum(counted(t) for t in trials), 0)
    waiting = [t for t in trials if t.state == TrialState.WAITING][:left]
    queued = [t.user_attrs.get("baseline") for t in waiting]
    queued_s = sum(costs.cold_s if trial_compiles(baseline(space, name)) else costs.eager_s
                   for name in queued if name in BASELINES)
    # Another queued configuration (a reused answer's): eager unless its scope compiles.
    queued_s += sum(costs.cold_s if compiles(queued_scope(t, space)) else costs.eager_s
                    for t in waiting if t.user_attrs.get("baseline") not in BASELINES)
    sampled = left - len(queued)
    if settings.study.sampler == "staged":  # its eager runs first, then compiles
        eager = min(eager_runs_left(space, trials), sampled)  # a queued eager baseline counts as tried
        return queued_s + eager * costs.eager_s + (sampled - eager) * costs.cold_s, left
    scopes = space.options("compile.scope", {})
    eager_share = scopes.count("none") / len(scopes)
    sampled_s = sampled * (eager_share * costs.eager_s + (1 - eager_share) * costs.cold_s)
    return queued_s + sampled_s, left


def queued_scope(trial: FrozenTrial, space: SearchSpace) -> str:
    """A queued trial's ``compile.scope``: its fixed parameter, the study's fixed knob, or the knob's default."""
    scope = trial.system_attrs.get("fixed_params", {}).get("compile.scope", space.fixed.get("compile.scope"))
    return str(scope if scope is not None else KNOBS["compile.scope"][1])


def in_flight_wall(serial_s: float, timed_s: float, k: int, cores: int) -> float:
    """The wall of runs that take ``serial_s`` one after another, ``timed_s`` of it timed, with ``k`` in flight: the
    timed parts still one at a time (the lease pauses the rest), everything else ``min(k, cores / CPU_PER_PROCESS)``
    at a time in between."""
    if k <= 1:
        return serial_s
    timed = min(max(timed_s, 0.0), serial_s)
    return timed + (serial_s - timed) / max(1.0, min(k, cores / CPU_PER_PROCESS))


def flight_of(study: optuna.Study, settings: Settings) -> int:
    """The search's processes in flight per slot: as the tuner started them (``IN_FLIGHT``), or as it will
    (:func:`autocompile.trial.slots.in_flight`, by the cores alone: no GPU is asked)."""
    from autocompile.config.sections import Resources
    from autocompile.trial.slots import in_flight

    if IN_FLIGHT in study.user_attrs:
        return int(study.user_attrs[IN_FLIGHT])
    # Not started yet (the tuner keeps it before its first estimate), or a study recorded before processes flew
    # together: those ran one at a time.
    return 1 if study.get_trials(deepcopy=False) else in_flight(settings, Resources(), None, memory=False)


def estimate(study: optuna.Study, space: SearchSpace, objective: Objective, settings: Settings,
             prior: tuple[float, str]) -> StudyEstimate | None:
    """The study's remaining cost as of now; None before the reference has run (nothing to go on)."""
    costs = run_costs(study, settings, prior)
    if costs is None:
        return None
    search_s, left = search_left_s(study, space, settings, costs)
    winner = stand_in(study, space, objective, costs)  # the confirmation's analysis runs once per estimate
    confirm_s, verdict_s = phase_costs(study, space, objective, settings, costs, winner)
    k, cores = flight_of(study, settings), len(os.sched_getaffinity(0))
    if k > 1:  # the timed parts: a search run's windows; a phase's processes at the side-by-side cap at most
        start = costs.start_s if costs.start_s is not None else costs.eager_s - settings.measure.max_timed_s
        search_s = in_flight_wall(search_s, left * (costs.eager_s - start), k, cores)
        timed = settings.compare.decided_processes * settings.compare.max_timed_s
        confirm_s, verdict_s = (in_flight_wall(s, timed, k, cores) for s in (confirm_s, verdict_s))
    done = (study.user_attrs.get(WARM_START) or {}).get("trial")  # a resumed study measured it for this winner
    warm_start_s = costs.warm_s if settings.study.warm_start and trial_compiles(winner) and (
        done is None or done != getattr(winner, "number", None)) else 0.0
    if k > 1 and verdict_s:  # one more process beside the verdicts' (search.warmstart.EarlyWarmStart)
        warm_start_s = in_flight_wall(warm_start_s, 0.0, k, cores)
    return StudyEstimate(search_s=search_s, confirm_s=confirm_s, verdict_s=verdict_s, warm_start_s=warm_start_s,
                         trials_left=left, costs=costs, in_flight=k)


def announce(found: StudyEstimate | None, settings: Settings) -> StudyEstimate | None:
    """The estimate before the search starts (returned), and a warning when it will not fit ``study.timeout_s``."""
    if found is None:
        return None
    if found.total_s < 1 and not found.trials_left:
        log.info("estimate: nothing left to measure (a finished study, resumed: its result follows)")
        return found
    log.info("estimate: %s", found.line())
    timeout = settings.study.timeout_s
    if timeout and found.total_s > timeout:
        fit = int(max(timeout, 0) // found.costs.cold_s)
        log.warning("the estimate (%s) exceeds study.timeout_s=%g (%s): the search stops starting trials at the "
                    "timeout, after about %d of its %d trials, and the phases after it still run",
                    duration(found.total_s), timeout, duration(timeout), min(fit, found.trials_left),
                    found.trials_left)
    return found


def remember(study: optuna.Study, when: str, found: StudyEstimate | None) -> None:
    """Keep the estimate made ``when`` (``before_search``, ``after_search``, ``after_confirm``) in the study, so the
    report sets each phase's expected seconds beside its wall time. The first estimate of a resumed study stays."""
    if found is None:
        return
    kept = dict(study.user_attrs.get(EXPECTED) or {})
    if when not in kept:
        kept[when] = {k: round(v, 1) for k, v in found.parts().items()}
        study.set_user_attr(EXPECTED, kept)


def expect_phase(remaining: Remaining, phase: str) -> None:
    """At a phase's start: the estimate again, with everything measured so far (the real winner, the search's
    compile and run times), logged for that phase and kept (``after_search`` / ``after_confirm``)."""
    found = remaining.update(force=True)
    if found is None:
        return
    remember(remaining.study, "after_search" if phase == "confirm" else "after_confirm", found)
    seconds = found.confirm_s if phase == "confirm" else found.verdict_s
    if seconds < 1 and found.total_s < 1:
        return  # a resumed study whose phases are measured: nothing to expect
    log.info("%s phase: expected ~%s (%s); the rest of the study ~%s", "confirmation" if phase == "confirm" else
             "verdict", duration(seconds), found.costs.basis, duration(found.total_s))


class Remaining:
    """The live view's "~N min left": the estimate at the last trial boundary, counted down since."""

    def __init__(self, study: optuna.Study, space: SearchSpace, objective: Objective, settings: Settings) -> None:
        self.study, self.space, self.objective, self.settings = study, space, objective, settings
        self.prior = compile_prior_s(settings)
        self.at: tuple[float, float] | None = None
        self.finished = -1

    def update(self, force: bool = False) -> StudyEstimate | None:
        """Estimate again when a trial finished since the last time (cheap otherwise), or ``force``."""
        done = sum(t.state in FINISHED for t in self.study.get_trials(deepcopy=False))
        if done == self.finished and not force:
            return None
        self.finished = done
        try:
            found = estimate(self.study, self.space, self.objective, self.settings, prior=self.prior)
        except Exception as exc:  # noqa: BLE001 - an estimate must never stop the study
            log.debug("no estimate: %r", exc)
            return None
        if found is not None:
            self.at = (found.total_s, time.time())
        return found

    def seconds(self) -> float | None:
        if self.at is None:
            return None
        total, since = self.at
        return max(total - (time.time() - since), 0.0)

    def text(self) -> str:
        left = self.seconds()
        return f"~{duration(left)} left" if left is not None else ""
