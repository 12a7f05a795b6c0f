"""The phases after the search: confirmation, then verdicts, side by side where the candidates can
share a process (:mod:`autocompile.study.phases.together`), else in fresh-process rounds
(planned by :mod:`autocompile.study.phases.plans`, run by :mod:`autocompile.study.phases.repeats`). Which ran,
and why, is kept in the study and reported."""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import FRESH_PROCESSES, SIDE_BY_SIDE
from autocompile.config.knobs import Env, TrialConfig
from autocompile.config.sections import StudySettings
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace
from autocompile.study.phases import sidebyside
from autocompile.study.phases.phase_plan import searched_runs, verdict_side_plan
from autocompile.study.phases.plans import (
    Slot,
    asked,
    confirm_plan,
    describe_plan,
    key_of,
    verdict_plan,
    winner_trial,
)
from autocompile.study.phases.racing import decided_early
from autocompile.study.phases.repeats import Measure, fly, run_plan, slot_done
from autocompile.study.phases.together import MeasureTogether, cold_of
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import (
    METHOD,
    NOT_ASKED,
    VERDICT_LOOK,
    interrupted,
    owner,
)
from autocompile.study.records.phase_trials import method, set_method
from autocompile.study.records.record import TrialRecord, set_attrs, user_attrs
from autocompile.study.statistics.decisions import first_look

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PhaseSettings:
    """What the phases decide by: the few settings they read, not the study's whole ``Settings``."""

    confirm_top: int
    """Leaders the confirmation races (``study.confirm_top``; 0: no confirmation)."""
    repeats: int
    """Fresh-process rounds of a phase that cannot run side by side (``study.repeats``)."""
    processes: int
    """Side-by-side processes of a phase (``compare.processes``)."""
    side_by_side: bool
    """``study.side_by_side``: False runs every phase in fresh-process rounds."""
    verdicts: Any
    """``study.verdicts``: ``auto``, ``all``, ``none`` or knob keys (:func:`plans.asked` reads it at the winner)."""
    memory_limit_gb: float
    """``objective.memory_limit_gb``: whether memory binds, which decides if ``auto`` asks checkpointing."""
    why_fresh: str
    """Why a phase runs in fresh-process rounds when ``side_by_side`` is off or no process can share."""
    env: Env
    """The workload's environment (device, world size, structure), detected once."""
    cannot_share: Callable[[list[sidebyside.Member]], str | None]
    """Why candidates cannot share a process (:func:`sidebyside.cannot_share` with the study's settings)."""
    in_flight: int = 1
    """Processes in flight at once (``launch.concurrency``): they build beside each other, time one at a time."""

    @classmethod
    def of(cls, settings: Settings, in_flight: int = 1) -> PhaseSettings:
        s = settings.study
        return cls(s.confirm_top, s.repeats, settings.compare.decided_processes, s.side_by_side, s.verdicts,
                   settings.objective.memory_limit_gb, "study.side_by_side=false", settings.env,
                   functools.partial(sidebyside.cannot_share, settings=settings), in_flight)


def run_phases(study: optuna.Study, space: SearchSpace, objective: Objective, settings: PhaseSettings,
               measure: Measure, together: MeasureTogether | None = None,
               expect: Callable[[str], None] | None = None) -> None:
    """Confirmation, then verdicts; each plan is logged (configurations, rounds) first. ``together`` measures one
    round side by side (None: fresh-process rounds only); ``expect(phase)`` says what a phase will cost as it
    starts (the study's estimate, made again with all it has measured)."""
    s = settings
    expect = expect or (lambda phase: None)
    if s.confirm_top:
        plan = confirm_plan(study, objective, s.confirm_top, s.repeats)
        if plan:
            expect("confirm")
            side = phase_method(study, "confirm", plan, settings, together) == SIDE_BY_SIDE
            if side:  # side by side, a round is a process: compare.processes of them
                plan = confirm_plan(study, objective, s.confirm_top, s.processes)
            log.info(describe_plan("confirmation", plan, side))
            together_or_fresh(study, "confirm", plan, settings, measure, together)
        else:
            log.info("confirmation phase skipped: fewer than two feasible distinct programs completed in the search "
                     "(infeasible: loss drift or memory over its limit, see the trial table)")
    winner = winner_trial(study, objective) if StudySettings.knobs_of(s.verdicts) != [] else None
    if winner is None:
        return
    wanted, left = asked(winner, s.verdicts, s.memory_limit_gb)
    for key, why in left.items():
        log.info("verdict %s not asked (study.verdicts=auto): %s", key, why)
    study.set_user_attr(NOT_ASKED, left)
    plan = verdict_plan(study, winner, space, wanted, s.repeats)
    if len(plan) <= s.repeats:
        log.info("verdict phase skipped: no searched knob with a question can change at the winner")
        return
    expect("verdict")
    undecided = METHOD["verdict"] not in study.user_attrs
    if together is not None and s.side_by_side and (undecided or method(study, "verdict")["method"] == SIDE_BY_SIDE) \
            and verdicts_together(study, winner, space, wanted, settings, measure, together, objective):
        return
    log.info(describe_plan(f"verdict (at trial {winner.number}, {TrialRecord.of(winner).name})", plan))
    for r in range(s.repeats):  # round by round: a neighbour found identical in round 0 needs no more
        run_plan(study, [slot for slot in verdict_plan(study, winner, space, wanted, s.repeats) if slot.round == r],
                 measure, s.in_flight)


def verdicts_together(study: optuna.Study, winner: FrozenTrial, space: SearchSpace, wanted: list[str] | None,
                      settings: PhaseSettings, measure: Measure, together: MeasureTogether,
                      objective: Objective | None = None) -> bool:
    """The verdict phase side by side, as :func:`phase_plan.verdict_side_plan` lays it out: each neighbour once
    alone and cold (compile time, memory, program; "identical program" stops it there), then the winner and the rest
    in side-by-side rounds, read at two looks (:func:`racing.verdicts`): a neighbour decided after half the processes
    leaves the rest. False when they cannot share a process (the caller runs fresh-process rounds)."""
    if METHOD["verdict"] not in study.user_attrs:
        set_method(study, "verdict", SIDE_BY_SIDE)
    won = TrialRecord.of(winner)
    plan = verdict_side_plan(study, winner, space, wanted, settings.processes)
    for why in plan.left_out:
        log.info("verdict %s left out", why)
    reused = reuse_search_runs(study, winner, [n.cold for n in plan.neighbours], [n.identity for n in plan.neighbours])
    timed = [n.cold.label for n in plan.neighbours if n.beside]
    log.info("verdict phase (at trial %d, %s): %d neighbours once alone (cold; %d of them measured so by the "
             "search already), then side by side with the winner in %d fresh processes%s", winner.number, won.name,
             len(plan.neighbours), reused, settings.processes,
             f" ({', '.join(timed)}: timed beside it in every confirmation process already)" if timed else "")
    run_plan(study, [n.cold for n in plan.neighbours], measure, settings.in_flight)
    plan = verdict_side_plan(study, winner, space, wanted, settings.processes)  # with the cold runs' outcomes
    members = [Slot("verdict", 0, "winner", winner.params, user_attrs(
        candidate=winner.number, name=won.name, compile_s_cold=won.measured.compile_s, cold_trial=winner.number))]
    members += [Slot("verdict", 0, n.cold.label, n.cold.params,
                     {k: n.cold.attrs[k] for k in ("knob", "value", "reference", "name")}
                     | {"cold_trial": n.first.number}) for n in plan.members() if n.first is not None]
    if len(members) < 2:
        return True  # every neighbour is the winner's program, failed or timed beside it: the verdicts say so
    rounds = [Slot("verdict", r, m.label, m.params, dict(m.attrs)) for r in range(settings.processes) for m in members]
    why = why_apart(study, members, settings)
    if why is None:
        if VERDICT_LOOK not in study.user_attrs:  # a resumed phase reads where it first planned to
            study.set_user_attr(VERDICT_LOOK, first_look(settings.processes))
        look = study.user_attrs[VERDICT_LOOK]

        def decided(r: int) -> set[str]:
            return decided_early(study, objective) if look is not None and r >= look else set()

        why = run_together(study, rounds, measure, together, drop_failed=True, decided=decided, look=look,
                           in_flight=settings.in_flight)
    if why:
        study.set_user_attr(VERDICT_LOOK, None)  # fresh-process rounds are read once
        set_method(study, "verdict", FRESH_PROCESSES, why)
        return False
    return True


def reuse_search_runs(study: optuna.Study, winner: FrozenTrial, cold: list[Slot], identities: list[str | None]) -> int:
    """A neighbour the search already measured needs no cold run of its own: a complete, feasible search trial of
    the same configuration was one fresh process alone with the study's cache, as the cold run would be, and the
    winner's own compile time and peak come from its search trial too. It is recorded as the neighbour's cold run
    (``cold_from``; its measurement, directory and artifacts; the identical-program check against the winner's
    fingerprint). Returns how many neighbours it spared."""
    won = TrialRecord.of(winner).measured.fingerprint
    searched = searched_runs(study)
    reused = 0
    for slot, key in zip(cold, identities, strict=True):
        src = searched.get(key)
        if src is None or slot_done(study, slot.key()):
            continue
        attrs = {k: v for k, v in src.user_attrs.items() if k not in SEARCH_ONLY} | slot.attrs | user_attrs(
            phase="verdict", round=slot.round, label=slot.label, method=SIDE_BY_SIDE, cold_from=src.number,
            owner=owner())
        if won and TrialRecord.of(src).measured.fingerprint == won:
            attrs["same_program_as"] = winner.number
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.COMPLETE, values=src.values, params=src.params, distributions=src.distributions,
            user_attrs=attrs, system_attrs=src.system_attrs))
        log.info("verdict %s: its cold run is search trial %d (the same configuration)", slot.label, src.number)
        reused += 1
    return reused


SEARCH_ONLY = ("baseline", "remeasure_of", "retry_of", "candidate", "prune_ratio", "prune_margin", "same_program_as",
               "duplicate_of", "reason")
"""A search trial's attributes that say what it was in the search, left out of a verdict cold run made from it."""


def run_together(study: optuna.Study, plan: list[Slot], measure: Measure, together: MeasureTogether,
                 drop_failed: bool = False, decided: Callable[[int], set[str]] | None = None, look: int | None = None,
                 in_flight: int = 1) -> str | None:
    """Each round of ``plan`` in one side-by-side process (a resumed study skips the rounds it has), ``in_flight``
    processes at a time (a wave, up to the next look: they build beside each other and time one after another; a
    candidate that failed beside the others leaves the rounds after the wave). Returns why the candidates could not
    share a process, or None.

    ``drop_failed`` (verdicts): a candidate that failed beside the others leaves the later rounds and its verdict
    says why, while the winner and the rest stay side by side (a compiled winner's twelve neighbours otherwise
    all fell back to fresh processes, ±30-100 % instead of ±2 %, for one that could not share). Without it, or
    when the winner failed or fewer than two are left, the first failure returns its reason. ``decided(r)``: the
    candidates decided before round ``r``, which leave it and the later ones (every one decided ends the phase);
    ``look``: the round where that is first read (no wave runs across it)."""
    told: set[str] = set()
    rounds = sorted({slot.round for slot in plan})
    while rounds:
        r = rounds[0]
        dropped = failed_beside(study, plan[0].phase) if drop_failed else set()
        done = decided(r) if decided is not None else set()
        if done - told:
            log.info("%s phase, read after %d processes: %s decided, left out of the later processes",
                     plan[0].phase, r, ", ".join(sorted(done - told)))
            told |= done
        if done and len({slot.label for slot in plan if slot.label not in dropped | done}) < 2:
            return None  # every neighbour decided: nothing left to time beside the winner
        if len({slot.label for slot in plan if slot.label not in dropped}) < 2:
            return f"{', '.join(sorted(dropped))} failed beside the others"
        # A wave runs to the next look (or the end), in_flight processes at a time: no barrier between its rounds
        wave = [q for q in (rounds if in_flight > 1 else rounds[:1]) if look is None or not r < look <= q]
        rounds = rounds[len(wave):]
        slots = {q: [slot for slot in plan if slot.round == q and not slot_done(study, slot.key())
                     and slot.label not in dropped | done] for q in wave}
        trials = _ask_rounds(study, [slot for q in wave for slot in slots[q]], measure)
        wave = [q for q in wave if slots[q]]
        groups = [[trials[slot.key()] for slot in slots[q]] for q in wave]
        whys = fly(together, groups, in_flight)
        for q, why in zip(wave, whys, strict=True):
            if why:
                failed = failed_beside(study, plan[0].phase) & {slot.label for slot in slots[q]}
                if not drop_failed or "winner" in failed or len(slots[q]) - len(failed) < 2:
                    return why
                log.warning("%s round %d: %s; its verdict says so, the rest stay side by side", plan[0].phase, q, why)
    return None


def _ask_rounds(study: optuna.Study, slots: list[Slot], measure: Measure) -> dict[tuple[str, int, str], optuna.Trial]:
    """The trials of ``slots``, queued and asked (another queued trial met on the way, one an interruption queued
    again, is measured alone)."""
    keys = {slot.key() for slot in slots}
    waiting = {key_of(t) for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))}
    for slot in slots:
        if slot.key() not in waiting:
            study.enqueue_trial(slot.params, user_attrs=user_attrs(
                phase=slot.phase, round=slot.round, label=slot.label, **{**slot.attrs, "method": SIDE_BY_SIDE}))
    trials: dict[tuple[str, int, str], optuna.Trial] = {}
    while len(trials) < len(keys):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Heartbeat of storage is supposed")
            trial = study.ask()
        set_attrs(trial, owner=owner())
        rec = TrialRecord.of(trial)
        key = (rec.phase, rec.round, rec.label)
        if key in keys and rec.method == SIDE_BY_SIDE:
            trials[key] = trial
        else:
            measure(trial)
    return trials


def failed_beside(study: optuna.Study, phase: str) -> set[str]:
    """Labels of ``phase``'s side-by-side repeats that ran and measured nothing (failed beside the others)."""
    return {rec.label for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL,
                                                                        TrialState.PRUNED))
            if (rec := TrialRecord.of(t)).phase == phase and rec.method == SIDE_BY_SIDE and rec.round >= 0
            and not rec.measured.ok and not interrupted(t)}


def together_or_fresh(study: optuna.Study, phase: str, plan: list[Slot], settings: PhaseSettings, measure: Measure,
                      together: MeasureTogether | None) -> None:
    """``plan`` side by side when its candidates can share a process, else in fresh-process rounds."""
    if phase_method(study, phase, plan, settings, together) == SIDE_BY_SIDE:
        side = [Slot(s.phase, s.round, s.label, s.params, {**s.attrs, "method": SIDE_BY_SIDE}) for s in plan]
        why = run_together(study, side, measure, together, in_flight=settings.in_flight)  # type: ignore[arg-type]
        if why is None:
            return
        set_method(study, phase, FRESH_PROCESSES, why)
    run_plan(study, plan, measure, settings.in_flight)


def phase_method(study: optuna.Study, phase: str, plan: list[Slot], settings: PhaseSettings,
                 together: MeasureTogether | None) -> str:
    """Decided once per phase and kept in the study, so a resumed phase goes on the same way."""
    if METHOD[phase] not in study.user_attrs:
        if together is None or not settings.side_by_side:
            set_method(study, phase, FRESH_PROCESSES, settings.why_fresh)
        else:
            why = why_apart(study, list({s.label: s for s in plan}.values()), settings)
            set_method(study, phase, FRESH_PROCESSES if why else SIDE_BY_SIDE, why or "")
    return method(study, phase)["method"]


def why_apart(study: optuna.Study, slots: list[Slot], settings: PhaseSettings) -> str | None:
    """Why the candidates of ``slots`` cannot share a process (:func:`sidebyside.cannot_share`), each
    described by its cold run."""
    return settings.cannot_share([sidebyside.Member(s.label, TrialConfig.from_flat(
        TrialRecord.of(study.trials[s.attrs["cold_trial"]]).config, settings.env, strict=False),
        cold_of(study.trials[s.attrs["cold_trial"]])) for s in slots])
