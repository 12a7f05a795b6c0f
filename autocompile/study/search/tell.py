"""One trial measured and told: the path every search trial and every repeat of the phases takes.

:func:`begin` samples the configuration and records it (and starts the heartbeat), :func:`measure_and_tell`
launches it in a fresh process under its stop rules and tells Optuna, and :func:`tell_measured`, its
tail, is also how each candidate of a side-by-side process is told (:mod:`autocompile.study.phases.together`).
What differs between a search trial and a repeat is passed in: the pruning rule, the inductor cache,
the program it must not compile again, and the compile time Optuna's value uses.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.knobs import TrialConfig, describe
from autocompile.config.sections import Resources
from autocompile.config.space import SearchSpace, identity
from autocompile.config.spec import MeasureSettings
from autocompile.study.records.context import StudyContext
from autocompile.study.records.lone_compile import as_alone, lone_rate
from autocompile.study.records.objective import LatestBest, Objective, PruneRule
from autocompile.study.records.optuna_store import heartbeat, interrupted, measured_trials, requeue, tell
from autocompile.study.records.record import Measurement, TrialRecord, set_attrs
from autocompile.study.search.numerics import numerics, reference
from autocompile.study.search.warmstart import drop_cache
from autocompile.trial.launcher import INTERRUPT, Interrupted, launch
from autocompile.trial.slots import slot_threads
from autocompile.trial.timing.result import ProgressEvent

log = logging.getLogger(__name__)


@dataclass
class Twin:
    """A program already measured: a trial that compiles it is stopped once compiled."""

    number: int
    """The trial that measured it."""
    what: str
    """It in words: ``the same program as trial 3 (...)``."""
    stands_for: FrozenTrial | None = None
    """The trial whose measurement stands for the stopped one (search: a copy, told as its twin was);
    None: the stopped trial is pruned with what it measured (a verdict neighbour)."""
    pending: Callable[[], FrozenTrial | None] | None = None
    """A twin still running (it claimed the program first): waits for its end and returns it finished, which then
    stands for the stopped one (None: it still runs after the patience)."""


FindTwin = Callable[[str], Twin | None]
"""A compiled program's fingerprint -> the trial that measured it, or None."""


def begin(study: optuna.Study, trial: optuna.Trial, space: SearchSpace) -> tuple[TrialConfig, Callable[[], None]]:
    """Sample ``trial``'s configuration and record it (config, identity, name); its heartbeat, beaten once:
    a trial without any heartbeat is never found stale, so it beats before anything can hang."""
    config = space.sample(trial)
    set_attrs(trial, config=config.active(space.env), identity=identity(config, space.env),
              name=describe(config, space.env))
    beat = heartbeat(study, trial)
    beat()
    return config, beat


def measure_and_tell(ctx: StudyContext, trial: optuna.Trial, config: TrialConfig, beat: Callable[[], None],
                     resources: Resources, *, twin_of: FindTwin | None = None,
                     prune: PruneRule | LatestBest | None = None, cache_dir: Path | None = None,
                     cold_compile_s: float | None = None, view: Any = None, brief: bool = False) -> None:
    """Launch ``trial`` in a fresh process (``run_dir/trials/NNNN``), stop it once compiled when ``twin_of``
    knows its program, or when ``prune`` says so; then tell Optuna what it measured.

    ``cache_dir``: the inductor cache it starts from (None: a cold one of its own, or ``settings.cache_dir``);
    ``cold_compile_s``: the compile time of Optuna's value when the run's own is warm; ``view``: the live
    view that shows it running; ``brief``: a run whose step time no decision reads (a verdict neighbour's cold run:
    its compile time, program, peak memory and numerics): :func:`brief_measure`."""
    study, objective, settings = ctx.study, ctx.objective, ctx.settings
    trial_dir = ctx.run_dir / "trials" / f"{trial.number:04d}"
    set_attrs(trial, trial_dir=str(trial_dir))
    if view is not None:
        view.running(trial.number, TrialRecord.of(trial).name, trial_dir)

    stopped_for: list[Twin] = []

    def rule(events: list[ProgressEvent], elapsed: float) -> str | tuple[str, str] | None:
        beat()
        compiled = next((e for e in events if e["event"] == "compiled"), None) if twin_of else None
        if compiled and (twin := twin_of(compiled["fingerprint"])) is not None:  # type: ignore[misc]
            # Compiled, and it is a program already measured (or being measured): its steps would time the same code.
            stopped_for[:] = [twin]
            return ("same_program", f"compiled {twin.what}, fingerprint {compiled['fingerprint']}")
        return prune(events, elapsed) if prune else None

    spec = settings.trial_spec(config, slot_threads(settings, resources))
    if brief:
        spec.measure = brief_measure(spec.measure, settings.objective.loss_steps)
    result = launch(trial_dir, spec,
                    cache_dir=cache_dir if cache_dir is not None else settings.cache_dir, should_stop=rule,
                    resources=resources, agents=ctx.agents)
    # A compile that shared the machine with processes in flight: priced as a lone run's (its CPU seconds)
    as_alone(result, lone_rate(TrialRecord.of(t).measured for t in measured_trials(study)))
    measured = Measurement.of(result)
    evidence = prune.evidence if prune is not None else None
    if measured.status == "pruned" and evidence:  # kept before the tell: a near miss is measured again
        set_attrs(trial, prune_ratio=evidence["ratio"], prune_margin=evidence["margin"])
    measured, twin = same_program_run(measured, twin_of, stopped_for[0] if stopped_for else None)
    if twin is not None and twin.pending is not None and (twin := settled(study, trial, twin, measured)) is None:
        return
    if twin is not None and twin.stands_for is not None:
        # The configuration is measured by its twin's steps; its own compile ran, and is noted.
        stands = TrialRecord.of(twin.stands_for)
        set_attrs(trial, same_program_as=twin.number, duplicate_of=twin.number, reason=measured.reason,
                  result=stands.result)
        tell(study, trial, twin.stands_for.state, twin.stands_for.values, stands.constraints)
        log.info("trial %d: %s", trial.number, measured.reason)
    elif twin is not None:
        set_attrs(trial, result=measured, same_program_as=twin.number, reason=measured.reason)
        tell(study, trial, TrialState.PRUNED, None, None)
    else:
        tell_measured(study, trial, objective, measured, cold_compile_s)


def brief_measure(measure: MeasureSettings, loss_steps: int) -> MeasureSettings:
    """A brief run's measurement: one timed window, no precision target, and a warm-up long enough that its steps
    reach the ``loss_steps`` the numerics check reads: its losses are judged on as many steps as any run's. With the
    default 3 warm-up steps a verdict neighbour's cold run of a GAN (pytorch/examples' dcgan) had 12 losses: it
    passed where its own program's search trial, 28 steps, had drifted past ``objective.loss_rtol``, and was
    recommended. The warm-up's extra steps are steady ones: its compile time (the warm-up's excess over as many
    steady steps) stays what it was."""
    warmup = max(measure.warmup_steps, loss_steps - measure.window_steps)
    return replace(measure, windows=1, precision=0.0, warmup_steps=warmup)


def settled(study: optuna.Study, trial: optuna.Trial, twin: Twin, measured: Measurement) -> Twin | None:
    """A running ``twin`` waited for: it with the trial it ended as (which then stands for ``trial``), or None once
    ``trial`` is queued again, as an interrupted one is (the twin had not ended after the patience, or was itself
    interrupted: nothing measured the program for it). The tuner stopping meanwhile raises :class:`Interrupted`."""
    ended = twin.pending() if twin.pending is not None else twin.stands_for
    if ended is not None and not interrupted(ended):
        return replace(twin, stands_for=ended)
    if INTERRUPT.is_set():
        raise Interrupted("the tuner is stopping: a trial waiting for its program's measurement")
    set_attrs(trial, result=measured)
    requeue(study, trial, f"stopped once compiled for trial {twin.number}, which "
                          f"{'had not ended' if ended is None else 'was interrupted'}")
    return None


def same_program_run(measured: Measurement, twin_of: FindTwin | None,
                     stopped_for: Twin | None = None) -> tuple[Measurement, Twin | None]:
    """``measured`` and the twin whose program it compiled, if any: the one it was stopped for once compiled, or,
    for a run that finished before a poll read its compile (a timed part shorter than the poll), a measured twin
    -- the same program all the same, read as stopped, so whether a program is measured twice never depends on the
    poll's timing. A run that finished while its twin still runs keeps its own measurement (the twin finds it)."""
    if measured.status == "same_program" and stopped_for is not None:
        return measured, stopped_for  # found again now, it may have ended otherwise: the stop was for this one
    twin = twin_of(measured.fingerprint) if twin_of and measured.fingerprint \
        and measured.status in ("same_program", "ok") else None
    if twin is not None and measured.status == "ok" and twin.pending is not None:
        return measured, None
    if twin is not None and measured.status == "ok":
        measured = replace(measured, status="same_program", reason=f"compiled {twin.what}, fingerprint "
                                                                   f"{measured.fingerprint} (it ran to its end)")
    return measured, twin


def tell_measured(study: optuna.Study, trial: optuna.Trial, objective: Objective, measured: Measurement,
                  cold_compile_s: float | None = None) -> None:
    """Record ``measured`` on ``trial`` and tell Optuna: complete, with its constraints (memory, and the
    losses against the eager reference), or failed / pruned with its reason. ``cold_compile_s``: the
    compile time Optuna's value uses instead of the run's own (a repeat with a warm cache: a warm
    compile is not what a new job pays)."""
    set_attrs(trial, result=measured)
    if not measured.ok:
        drop_cache(trial.user_attrs.get("trial_dir"))  # no repeat or side-by-side process reads it
        set_attrs(trial, reason=measured.reason or "")
        tell(study, trial, TrialState.PRUNED if measured.status == "pruned" else TrialState.FAIL, None, None)
        log.info("trial %d %s: %s", trial.number, measured.status, measured.reason)
        return
    ref = reference(study)
    constraints = objective.constraints(measured, ref["losses"] if ref else None)
    for k, v in constraints.items():
        trial.set_constraint(k, v)
    set_attrs(trial, numerics=numerics(ref), constraints=constraints)
    if any(v > 0 for v in constraints.values()):
        drop_cache(trial.user_attrs.get("trial_dir"))  # infeasible: never a candidate of the phases
    told = measured if cold_compile_s is None else dataclasses.replace(measured, compile_s=cold_compile_s)
    tell(study, trial, TrialState.COMPLETE, objective.values(told), constraints)
