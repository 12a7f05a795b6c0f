"""``task=tune``: the study loop. Ask a configuration, measure it in a fresh process, tell the result.

Reads like the script it is: open (or resume) the study, queue the baselines, then until enough
trials finished: sample, skip what was already measured, launch with the pruning rule, record,
tell. Failures are told as failures with their reason; a study that only fails is stopped. Then the phases
(:mod:`autocompile.study.phases.run`: the best programs again, the winner's one-knob neighbours), the report.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.knobs import KnobError
from autocompile.config.sections import Resources
from autocompile.config.settings import ConfigError, Settings
from autocompile.config.space import SearchSpace
from autocompile.study.answers import answer_key, answer_of, keep
from autocompile.study.estimate import Remaining, announce, expect_phase, remember
from autocompile.study.phases.plans import recommended, winner_trial
from autocompile.study.phases.racing import REPEAT_PHASES, alone_noise, alone_window_spread
from autocompile.study.phases.repeats import alone_on_the_machine, measure_repeat
from autocompile.study.phases.run import PhaseSettings, run_phases
from autocompile.study.phases.together import measure_together, process_dir
from autocompile.study.records.context import StudyContext
from autocompile.study.records.lone_compile import describe as describe_lone
from autocompile.study.records.objective import LatestBest, Objective, PruneRule, near_misses
from autocompile.study.records.observers import NO_VIEW, LiveView, Outcome, Quiet, StudyObserver, study_wall
from autocompile.study.records.optuna_store import (
    CLAIM_LOCK,
    IN_FLIGHT,
    counted,
    feasible,
    file_lock,
    find_measured,
    measured_trials,
    open_for,
    running_twin,
    tell,
    wait_finished,
)
from autocompile.study.records.record import Measurement, TrialRecord, set_attrs
from autocompile.study.reuse import known_answer, reference_from, reverifies, start_from
from autocompile.study.search.baselines import queue_as_written, queue_baselines
from autocompile.study.search.budget import Budget
from autocompile.study.search.numerics import (
    check_script_runs,
    ensure_reference,
    probed_env,
    reference,
    reference_peak,
)
from autocompile.study.search.samplers import make_sampler
from autocompile.study.search.tell import begin, measure_and_tell
from autocompile.study.search.twins import search_twins
from autocompile.study.search.warmstart import EarlyWarmStart, prune_caches, warm_start
from autocompile.trial.launcher import INTERRUPT, Agents, Interrupted
from autocompile.trial.slots import flights

log = logging.getLogger(__name__)
optuna.logging.set_verbosity(optuna.logging.WARNING)



def tune(settings: Settings, run_dir: Path, config_yaml: str, observer: StudyObserver | None = None) -> Outcome:
    """Open (or resume) the study, measure the reference, search, run the phases and the winner's warm start;
    ``observer`` is told as it goes (the live view, MLflow). The report is the caller's."""
    observer = observer or Quiet()
    space = SearchSpace(settings.env, settings.fixed_knobs, settings.study.extended, settings.lead_knobs)
    objective = Objective(settings.objective)
    study = open_for(settings, run_dir, objective.directions, make_sampler(settings.study.sampler, space,
                                                                            settings.study.seed))
    remaining = Remaining(study, space, objective, settings)
    (run_dir / "config.yaml").write_text(config_yaml)
    observer.opened(study, objective, remaining)
    key = answer_key(settings)
    known = known_answer(study, settings, key)  # an exact one lends its numerics reference too
    if reference(study) is None and not reference_from(study, known, key, settings):
        # Measured once the tuner's own start (imports, Optuna, MLflow) is over, like every trial: only the
        # live view's refresh runs beside it.
        with observer.live(estimate=False) as view:
            view.running("reference", "numerics reference (eager, fp32): its steps set the study's estimate",
                         run_dir / "reference")
            ensure_reference(study, settings, run_dir)
            view.finished("reference")
        check_script_runs(study)
    found = reference(study)
    if settings.script.given:  # what the script's reference run saw narrows its space, as a model's build does
        try:
            space = SearchSpace(probed_env(settings.env, found), settings.fixed_knobs,
                                settings.study.extended, settings.lead_knobs)
        except KnobError as exc:  # a fixed knob the script's model cannot take (regional with no blocks)
            raise ConfigError(f"{exc} (seen in the script's reference run: {run_dir / 'reference'})") from exc
        study.sampler = make_sampler(settings.study.sampler, space, settings.study.seed)
        remaining.space = space
    settings = start_from(study, space, settings, key, known)  # a known answer: re-verified, or its ranking first
    remaining.settings = settings
    if settings.study.baselines:
        queue_baselines(study, space)
        if found is not None and found.get("compile_calls"):
            queue_as_written(study, space, found["compile_calls"])
    peak = reference_peak(found)
    slots = flights(settings, peak)  # the processes in flight, each on its slot's resources
    study.set_user_attr(IN_FLIGHT, slots.count(slots[0]))
    agents = Agents(settings.launch.rdzv_host, settings.launch.remote_agent)
    log.info("study %s: %d distinct configurations in the space, %d trials asked, %d in flight; storage %s",
             study.study_name, space.size(), settings.study.n_trials, len(slots), settings.study.storage or run_dir)
    remember(study, "before_search", announce(remaining.update(), settings))

    INTERRUPT.clear()  # a study interrupted earlier in this process (a test) must not stop this one
    budget = Budget(study, settings, INTERRUPT)
    run = Runner(StudyContext(study, space, objective, settings, run_dir, agents), budget, observer, remaining)
    with observer.live() as view:
        run.search(slots, view)
        if not budget.stop.is_set() and budget.stop_reason == f"{settings.study.n_trials} trials finished":
            run.remeasure(slots, view)
    if said := describe_lone(TrialRecord.of(t).measured for t in measured_trials(study)):
        log.info(said)
    interrupted = budget.stop.is_set()
    early = EarlyWarmStart.of(study, settings, run_dir, slots, peak)  # beside the verdicts, not alone after them
    if not interrupted and budget.stop_reason != "failure guard":
        interrupted = run.phases(slots[0], slots.count(slots[0]), early.start if early else None)
    if early is not None:
        early.finish()
    if not interrupted:
        winner = recommended(study, objective)[0]
        if settings.study.warm_start:
            warm_start(study, settings, winner, run_dir)
        prune_caches(study, winner, run_dir)  # a resumed study's repeats start warm from the caches it still has
        if (answer := answer_of(study, objective, settings, key)) is not None:
            keep(answer, run_dir)
    return Outcome(study, space, objective, budget.stop_reason, study_wall(study, budget.started), interrupted,
                   len(budget.released))


@dataclass
class Runner:
    """The search and the phases of one study run, each trial released if its measurement is cut short."""

    ctx: StudyContext
    budget: Budget
    observer: StudyObserver
    remaining: Remaining

    @property
    def study(self) -> optuna.Study:
        return self.ctx.study

    @property
    def settings(self) -> Settings:
        return self.ctx.settings

    def release(self, exc: BaseException, numbers: list[int]) -> None:
        """Ctrl-C, the stop flag or an error: the trial measured nothing; left RUNNING, it would hold a slot of
        the budget and a twin waiting on it until this process is gone."""
        stopping = isinstance(exc, (KeyboardInterrupt, Interrupted))
        for number in numbers:
            self.budget.release("the tuner was interrupted" if stopping else f"the tuner failed: {exc!r}", number)

    def slot_loop(self, resources: Resources, view: LiveView) -> None:
        while (trial := self.budget.next_trial(view)) is not None:
            try:
                run_trial(self.ctx, trial, view, resources)
            except BaseException as exc:
                self.release(exc, [trial.number])
                if isinstance(exc, Interrupted):
                    return
                raise
            finally:
                view.finished(trial.number)
            self.observer.recorded(self.study.trials[trial.number])

    def search(self, slots: list[Resources], view: LiveView) -> None:
        try:
            if len(slots) == 1:
                self.slot_loop(slots[0], view)  # Ctrl-C lands in this very loop: launch kills the tree
            else:
                with ThreadPoolExecutor(len(slots), thread_name_prefix="slot") as pool:
                    futures = [pool.submit(self.slot_loop, r, view) for r in slots]
                    try:
                        wait(futures, return_when=FIRST_EXCEPTION)
                        for future in futures:
                            future.result()
                    except BaseException:
                        # Ctrl-C or a slot's error lands here, in the main thread; the pool's exit then
                        # waits for the other slots, which must stop first: their launches kill their
                        # trials, next_trial hands out none.
                        self.budget.interrupt()
                        raise
        except KeyboardInterrupt:
            self.budget.interrupt()
        if self.budget.stop.is_set():
            self.budget.release("the tuner was interrupted")  # e.g. asked but not yet launched when Ctrl-C came
        view.refresh(self.study.get_trials(deepcopy=False))

    def remeasure(self, slots: list[Resources], view: LiveView) -> None:
        """The near-miss prunes (``objective.near_misses``) measured once more, as search trials beyond n_trials."""
        with file_lock(self.ctx.run_dir / "remeasure.lock"):  # tuners of one study ending together pick once
            picked = near_misses(self.study.get_trials(deepcopy=False), self.settings.study.remeasure_pruned)
            for t in picked:
                self.study.enqueue_trial(t.params, user_attrs={"remeasure_of": t.number})
        if not picked:
            return
        log.info("measuring %d near-miss prune(s) once more (a prune is one noisy window): %s", len(picked),
                 "; ".join(f"trial {t.number} ({TrialRecord.of(t).name}, {TrialRecord.of(t).prune_ratio - 1:+.0%} "
                           f"over the best, margin {TrialRecord.of(t).prune_margin - 1:.0%})" for t in picked))
        done = sum(counted(t) for t in self.study.get_trials(deepcopy=False))
        self.budget.extra = max(done - self.settings.study.n_trials, 0) + len(picked)
        self.search(slots, view)

    def phases(self, resources: Resources, in_flight: int = 1,
               on_verdicts: Callable[[FrozenTrial | None], None] | None = None) -> bool:
        """After the search: the best programs and the baselines again; then the verdicts (``on_verdicts`` told
        their winner as they start). True: interrupted."""
        s = self.settings.study

        def expect(phase: str) -> None:
            expect_phase(self.remaining, phase)
            if phase == "verdict" and on_verdicts is not None:
                on_verdicts(winner_trial(self.study, self.ctx.objective))

        if not (s.confirm_top or s.verdict_knobs() != []):
            return False
        try:
            with alone_on_the_machine(self.study, self.ctx.run_dir), \
                    self.observer.live(table=False) as view:
                view.refresh(self.study.get_trials(deepcopy=False))
                run_phases(self.study, self.ctx.space, self.ctx.objective, PhaseSettings.of(self.settings, in_flight),
                           lambda trial: self.repeat(trial, view, resources),
                           lambda trials: self.together(trials, view, resources),
                           expect)
        except (KeyboardInterrupt, Interrupted):
            self.budget.interrupt()
            return True
        return False

    def repeat(self, trial: optuna.Trial, view: LiveView, resources: Resources) -> None:
        a = TrialRecord.of(trial)
        view.running(trial.number, f"{a.phase} round {a.round}: {a.label}",
                     self.ctx.run_dir / "trials" / f"{trial.number:04d}")
        try:
            run_trial(self.ctx, trial, NO_VIEW, resources)
            view.refresh(self.study.get_trials(deepcopy=False))  # and the time left
        except BaseException as exc:
            self.release(exc, [trial.number])
            raise
        finally:
            view.finished(trial.number)
        self.observer.recorded(self.study.trials[trial.number])

    def together(self, trials: list[optuna.Trial], view: LiveView, resources: Resources) -> str | None:
        a = TrialRecord.of(trials[0])
        key = f"{a.phase} round {a.round}"
        labels = ", ".join(TrialRecord.of(t).label or "" for t in trials)
        view.running(key, f"{key} side by side: {labels}", process_dir(self.ctx.run_dir, a.phase, a.round))
        try:
            why = measure_together(self.ctx, trials, resources)
            view.refresh(self.study.get_trials(deepcopy=False))  # and the time left
        except BaseException as exc:
            self.release(exc, [t.number for t in trials])
            raise
        finally:
            view.finished(key)
        for trial in trials:
            self.observer.recorded(self.study.trials[trial.number])
        return why


def run_trial(ctx: StudyContext, trial: optuna.Trial, view: LiveView, resources: Resources) -> None:
    study, space, objective, settings = ctx.study, ctx.space, ctx.objective, ctx.settings
    if TrialRecord.of(trial).phase in REPEAT_PHASES:
        # A repeat (also one a resumed search asks: a killed phase queued it again): measured again.
        measure_repeat(ctx, trial, resources)
        return
    set_attrs(trial, phase="search")
    # Slots and tuners claim a configuration one at a time: the first to claim it measures, the rest see its identity
    # and wait for it (two trials of one configuration begun at once each saw no twin, and both measured).
    with file_lock(ctx.run_dir / CLAIM_LOCK):
        config, beat = begin(study, trial, space)
        record = TrialRecord.of(trial)
        key, name = record.identity or "", record.name
        # A near-miss prune measured once more is not answered by its first measurement.
        prior = find_measured(study, key, exclude=trial.number) if record.remeasure_of is None else None
        twin = running_twin(study, key, trial.number) if prior is None and record.remeasure_of is None else None
    if twin is not None:
        # Another slot or tuner is measuring this very configuration: wait for its result (a live
        # twin ends within its own timeout; a dead one is failed by pid or heartbeat meanwhile).
        view.running(trial.number, f"waiting for trial {twin.number} ({name})")
        if wait_finished(study, twin.number, settings.patience_s, beat, stop=INTERRUPT) is not None:
            prior = find_measured(study, key, exclude=trial.number)  # the same rules as without a wait
    if prior is not None:
        # Same configuration, same workload: its measurement stands; the sampler still learns from it.
        original = TrialRecord.of(prior)
        set_attrs(trial, duplicate_of=prior.number, reason=f"same configuration as trial {prior.number}"
                  + (f": {original.reason}" if original.reason else ""), result=original.result,
                  trial_dir=original.trial_dir)
        tell(study, trial, prior.state, prior.values, original.constraints)
        log.info("trial %d = trial %d (%s): not measured again", trial.number, prior.number, name)
        return

    def against_best() -> PruneRule | None:
        noise = alone_noise(study)  # a search trial is one alone process
        scored = scored_results(study, objective)
        best = min(scored, key=lambda s: objective.score(s[1]), default=None)
        return objective.stop_rule(best, noise, len(scored), alone_window_spread(study))

    prune = LatestBest(against_best, lambda: len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))) \
        if settings.study.prune and record.baseline is None else None

    anyway = record.baseline is not None or record.remeasure_of is not None  # measured whatever it compiles
    measure_and_tell(ctx, trial, config, beat, resources,
                     twin_of=search_twins(study, trial, ctx.run_dir, settings.patience_s, beat, measured_anyway=anyway),
                     prune=prune, view=view, brief=reverifies(study))


def scored_results(study: optuna.Study, objective: Objective) -> list[tuple[int, Measurement]]:
    """The feasible complete measurements so far (with their trials' numbers): the best under the objective's
    single score is the minimum of these noisy values."""
    return [(t.number, TrialRecord.of(t).measured) for t in measured_trials(study)
            if t.state == TrialState.COMPLETE and feasible(t)]

