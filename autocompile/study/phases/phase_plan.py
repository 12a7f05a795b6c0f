"""What the side-by-side verdict phase will run, as one plan: the runner runs it
(:func:`autocompile.study.phases.run.verdicts_together`) and the estimate prices it
(:mod:`autocompile.study.phase_costs`), so the two cannot drift.

Each neighbour of the winner is measured once alone with a cold cache (its compile time, peak memory and program;
a search trial of the same configuration stands in for that run), then, unless it compiled the winner's program,
failed, or the confirmation already timed it beside the winner in every process, it joins the winner in
``compare.processes`` side-by-side processes. Before the search, a :class:`Foresight` says which neighbours the
search and the confirmation are expected to measure, in place of the trials that will.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import SIDE_BY_SIDE, compiles
from autocompile.config.knobs import KNOBS, describe
from autocompile.config.space import CONFIRMED_BASELINES, SearchSpace, identity
from autocompile.study.phases.plans import Slot, neighbours
from autocompile.study.records.optuna_store import METHOD, feasible, measured_trials
from autocompile.study.records.phase_trials import method, phase_trials, step_time
from autocompile.study.records.record import TrialRecord, user_attrs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Foresight:
    """Before the search: the configurations (identities) it is expected to measure, and those the confirmation is
    expected to time beside the winner in every process, standing in for the trials that will."""

    searched: frozenset[str | None] = frozenset()
    """Measured by the search: a neighbour among them takes that trial as its cold run."""
    beside: frozenset[str | None] = frozenset()
    """Timed beside the winner in every confirmation process: a neighbour among them joins no verdict process."""


@dataclass(frozen=True)
class Neighbour:
    """One verdict neighbour in the plan."""

    cold: Slot
    """Its one cold run, alone (round -1)."""
    identity: str | None
    """Its configuration's identity."""
    compiled: bool
    """Whether it compiles anything (a compiled member warms up from its cold cache in every process)."""
    searched: bool
    """A search trial of the same configuration is (or, before the search, is expected to be) its cold run."""
    beside: str | None
    """The confirmation candidate (``#N``) timed beside the winner in every confirmation process, whose windows its
    verdict reads; None: it needs verdict processes of its own."""
    first: FrozenTrial | None = None
    """Its cold run once it ran (or a search trial recorded as it)."""

    @property
    def runs_cold(self) -> bool:
        """Its cold run is still to run in a process of its own."""
        return self.first is None and not self.searched

    @property
    def joins(self) -> bool:
        """It joins the winner's side-by-side processes: timed nowhere beside it yet, and its cold run (when it ran)
        measured a program of its own."""
        return self.beside is None and (self.first is None or step_time(self.first) is not None)


@dataclass(frozen=True)
class VerdictPlan:
    """The side-by-side verdict phase at one winner."""

    winner: Any
    """The winner's trial (or the estimate's stand-in: anything with its ``config`` user attribute)."""
    neighbours: list[Neighbour]
    """Its neighbours, one per question and value."""
    processes: int
    """Side-by-side processes the members run in (``compare.processes``)."""
    rounds_done: set[int] = field(default_factory=set)
    """The processes already run (a resumed phase)."""
    left_out: list[str] = field(default_factory=list)
    """Neighbours that cannot be made valid, each with why."""

    @property
    def winner_compiles(self) -> bool:
        return compiles((self.winner.user_attrs.get("config") or {}).get("compile.scope"))

    def members(self) -> list[Neighbour]:
        """The neighbours timed beside the winner in the verdict processes."""
        return [n for n in self.neighbours if n.joins]

    def processes_left(self) -> int:
        return self.processes - len(self.rounds_done) if self.members() else 0


def verdict_side_plan(study: optuna.Study, winner: Any, space: SearchSpace, wanted: list[str] | None,
                      processes: int, foresight: Foresight | None = None) -> VerdictPlan:
    """The side-by-side verdict phase at ``winner``, as the study's records stand (a resumed phase: its cold runs and
    processes done), or before the search as ``foresight`` expects it."""
    left_out: list[str] = []
    found = neighbours(winner, space, wanted, left_out)
    if foresight is None:
        searched = set(searched_runs(study))
        beside = timed_beside(study, winner, processes) if isinstance(winner, FrozenTrial) else {}
    else:
        searched, beside = set(foresight.searched), {ident: "confirmation" for ident in foresight.beside}
    finished = phase_trials(study, "verdict") if method(study, "verdict")["method"] == SIDE_BY_SIDE else []
    firsts = {rec.label: t for t in finished if (rec := TrialRecord.of(t)).round == -1}
    won = TrialRecord.of(winner) if isinstance(winner, FrozenTrial) else None
    plan = []
    for key, value, config in found:
        ident = identity(config, space.env)
        label = f"{key}={value}"
        attrs = user_attrs(knob=key, value=value, reference=(won.config if won else {}).get(key, KNOBS[key][1]),
                           name=describe(config, space.env), same_as=won.measured.fingerprint if won else None,
                           same_as_trial=getattr(winner, "number", None), cold_run=True, timed_in=beside.get(ident))
        plan.append(Neighbour(Slot("verdict", -1, label, space.params(config.flat()), attrs), ident,
                              compiles(config.compile.scope), ident in searched, beside.get(ident),
                              firsts.get(label)))
    done = {rec.round for t in finished if (rec := TrialRecord.of(t)).round is not None and rec.round >= 0}
    return VerdictPlan(winner, plan, processes, done, left_out)


def timed_beside(study: optuna.Study, winner: FrozenTrial, processes: int) -> dict[str | None, str]:
    """Configuration identity -> confirmation label (``#N``) of each candidate timed beside ``winner`` in every one of
    the confirmation's side-by-side processes (at least ``processes``): the verdict processes would time that pair
    again in as many processes, window by window, so the verdict reads the confirmation's (``TrialRecord.timed_in``).
    Empty when the confirmation ran in fresh-process rounds or without the winner."""
    if METHOD["confirm"] not in study.user_attrs or method(study, "confirm")["method"] != SIDE_BY_SIDE:
        return {}
    rounds: dict[str, set[int]] = {}
    candidate: dict[str, int] = {}
    for t in phase_trials(study, "confirm"):
        rec = TrialRecord.of(t)
        if rec.label and rec.round is not None and rec.candidate is not None and step_time(t) is not None:
            rounds.setdefault(rec.label, set()).add(rec.round)
            candidate[rec.label] = rec.candidate
    mine = rounds.get(f"#{winner.number}", set())
    if len(mine) < processes:
        return {}
    return {TrialRecord.of(study.trials[candidate[label]]).identity: label for label, done in rounds.items()
            if label != f"#{winner.number}" and done >= mine}


def searched_runs(study: optuna.Study) -> dict[str | None, FrozenTrial]:
    """Configuration identity -> the first complete, feasible search trial that measured it: what stands in for a
    verdict neighbour's cold run."""
    return {rec.identity: t for t in reversed(measured_trials(study))
            if t.state == TrialState.COMPLETE and feasible(t) and (rec := TrialRecord.of(t)).measured.ok}


def raced(study: optuna.Study) -> set[str | None]:
    """Identities of the baselines every confirmation races (``CONFIRMED_BASELINES``), so times beside its winner."""
    return {rec.identity for t in measured_trials(study) if (rec := TrialRecord.of(t)).baseline in CONFIRMED_BASELINES}
