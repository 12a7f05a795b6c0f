"""The confirmation phase's answer, typed: the race among the search's best programs and the baselines.

A pure function of the study's trials (:func:`confirmed`), so a resumed study, the report and MLflow read
the same answer. The leader has the best mean score over rounds; a candidate ties with it when their paired
95% interval lies within +-``objective.tie_margin`` (equivalence, not "the interval contains zero"); the
simplest of the leader and its ties is the winner (:func:`autocompile.study.statistics.decisions.race`).
``Confirmation.as_dict`` is what ``summary.json`` holds under ``confirmed``.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Literal

from optuna import Study

from autocompile.config.choices import FRESH_PROCESSES, SIDE_BY_SIDE, Knobs
from autocompile.config.space import CONFIRMED_BASELINES
from autocompile.study.phases.racing import compile_spread, simplicity
from autocompile.study.phases.sidebyside import speed_changes
from autocompile.study.records.compile_prior import class_prior
from autocompile.study.records.objective import Objective
from autocompile.study.records.objective import time_to_train as time_to_train_s
from autocompile.study.records.phase_trials import method, phase_trials, step_time
from autocompile.study.records.record import TrialRecord
from autocompile.study.statistics.decisions import MAX_MORE, out_of_reach, processes_to_decide, race
from autocompile.study.statistics.intervals import (
    CompileSpread,
    Ratio,
    from_rounds,
    level,
    paired_ratio,
    paired_windows,
    time_to_train,
)

INCUMBENT = "incumbent_identity"
"""Study attribute: the identity of a known winner this study re-verifies (``study.reuse``): the race keeps it
unless a candidate is measurably faster (:func:`autocompile.study.statistics.decisions.race`)."""
Status = Literal["leader", "tied", "slower", "faster", "undetermined"]
"""A candidate against the leader (:func:`autocompile.study.statistics.decisions.classify`)."""


@dataclass
class Candidate:
    """A configuration raced in the confirmation phase (a search trial's program)."""

    label: str
    number: int
    name: str
    config: Knobs
    baseline: str | None
    compile_s: float
    """Cold compile seconds, from its search trial (repeats may reuse its warm cache)."""
    steps: dict[int, float] = field(default_factory=dict)
    """Round -> step seconds of its repeats."""
    windows: dict[int, list[float]] = field(default_factory=dict)
    """Side by side: round (process) -> its window step times, aligned with the other candidates'."""
    cpu: dict[int, list[float]] = field(default_factory=dict)
    """Side by side: round (process) -> its windows' CPU seconds per step, where the process recorded them."""

    def scores(self, objective: Objective) -> dict[int, float]:
        """Per round, lower is better: step time (throughput) or time to train with the cold compile time
        (time_to_train, and pareto, which has no single score)."""
        if objective.kind == "throughput":
            return dict(self.steps)
        horizon = objective.settings.horizon_steps
        return {r: time_to_train_s(self.compile_s, s, horizon) for r, s in self.steps.items()}

    def step_s(self) -> float:
        return math.exp(statistics.fmean(map(math.log, self.steps.values())))

    def row(self, status: Status | None = None, vs_leader: Ratio | None = None,
            more_processes: int | None = None, decide: str = "") -> RaceRow:
        return RaceRow(self.label, self.number, self.name, self.config, self.baseline, self.compile_s,
                       len(self.steps), self.step_s() if self.steps else None,
                       {str(r): s for r, s in sorted(self.steps.items())}, sum(map(len, self.windows.values())),
                       status, vs_leader, more_processes, decide)


@dataclass(frozen=True)
class RaceRow:
    """One candidate of the race as the report shows it."""

    label: str
    trial: int
    """Its search trial (the program's cold run)."""
    name: str
    config: Knobs
    baseline: str | None
    compile_s_cold: float
    rounds: int
    step_s_geomean: float | None
    """Geometric mean of its repeats' step times (None: no repeat completed)."""
    step_s_rounds: dict[str, float]
    windows: int
    """Side by side: its timed windows over all processes (0: fresh-process rounds)."""
    status: Status | None = None
    vs_leader: Ratio | None = None
    """Its score over the leader's (None: it is the leader, or no shared round)."""
    more_processes: int | None = None
    """Undetermined: about how many more processes would decide it (None: no interval to extrapolate, or none
    would: :attr:`decide` says which)."""
    decide: str = ""
    """Undetermined: what would decide it, in words (:func:`what_decides`)."""

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "trial": self.trial, "name": self.name, "config": self.config,
                "baseline": self.baseline, "compile_s_cold": self.compile_s_cold, "rounds": self.rounds,
                "step_s_geomean": self.step_s_geomean, "step_s_rounds": self.step_s_rounds, "windows": self.windows,
                "status": self.status, "vs_leader": self.vs_leader.as_dict() if self.vs_leader else None,
                "more_processes": self.more_processes, "decide": self.decide}


@dataclass(frozen=True)
class Gain:
    """The winner against a baseline: step time and score (time to train), each winner / baseline - 1."""

    step: Ratio | None
    score: Ratio | None

    @property
    def text(self) -> str:
        return self.step.text() if self.step else "no shared round"

    def as_dict(self) -> dict[str, Any]:
        return {"step": self.step.as_dict() if self.step else None,
                "score": self.score.as_dict() if self.score else None, "text": self.text}


@dataclass(frozen=True)
class Confirmation:
    """What the confirmation phase decided; ``winner`` None: nothing was raced (``reason`` says why)."""

    winner: RaceRow | None
    candidates: list[RaceRow]
    reason: str = ""
    leader: str = ""
    """The leader's label: the best mean score over rounds, or the incumbent kept."""
    incumbent: str = ""
    """The known winner's label when the study re-verified one (:data:`INCUMBENT`) and raced it today."""
    tied_with_leader: list[str] = field(default_factory=list)
    tie_margin: float = 0.0
    decided: bool = False
    """Every candidate is tied with the leader or measurably slower."""
    compile_spread: CompileSpread | None = None
    gains: dict[str, Gain] = field(default_factory=dict)
    """``eager`` / ``compile``: the winner against that baseline, where it raced and did not win."""
    beats_default_compile: bool = False
    rounds: int = 0
    method: dict[str, str] = field(default_factory=lambda: {"method": FRESH_PROCESSES, "why": ""})
    windows: int = 0
    speed_changes: list[str] = field(default_factory=list)
    conclusion: str = ""

    @property
    def side_by_side(self) -> bool:
        return self.method["method"] == SIDE_BY_SIDE

    @property
    def undetermined(self) -> list[RaceRow]:
        """Candidates the race could not tell from the leader (or measurably faster: a mean the rounds left open)."""
        return [c for c in self.candidates if c.status in ("undetermined", "faster")]

    def as_dict(self) -> dict[str, Any]:
        if self.winner is None:
            return {"winner": None, "reason": self.reason, "candidates": [c.as_dict() for c in self.candidates]}
        return {
            "winner": self.winner.as_dict(), "leader": self.leader, "speed_changes": self.speed_changes,
            "incumbent": self.incumbent, "tied_with_leader": self.tied_with_leader, "tie_margin": self.tie_margin,
            "decided": self.decided,
            "undetermined": [{"label": c.label, "name": c.name, "status": c.status,
                              "vs_leader": c.vs_leader.as_dict() if c.vs_leader else None,
                              "more_processes": c.more_processes, "decide": c.decide} for c in self.undetermined],
            "compile_spread": self.compile_spread.as_dict() if self.compile_spread else None,
            "candidates": [c.as_dict() for c in self.candidates],
            "gains": {name: g.as_dict() for name, g in self.gains.items()},
            "beats_default_compile": self.beats_default_compile, "rounds": self.rounds, "method": self.method,
            "windows": self.windows, "conclusion": self.conclusion,
        }


def versus(a: Candidate, b: Candidate, objective: Objective, score: bool,
           spread: CompileSpread | None = None) -> Ratio | None:
    """``a / b``: of step time, or (``score``) of the objective's score. Side by side, windows are paired
    within processes; otherwise rounds are paired, each a fresh process per candidate. Time to train
    carries each side's one cold compile with the study's compile spread (``spread``)."""
    step: Ratio | None = paired_windows(b.windows, a.windows, b.cpu, a.cpu) if a.windows and b.windows else (
        from_rounds(paired_ratio(a.steps, b.steps)))
    if step is None or not score or objective.kind == "throughput":
        return step
    spread = spread or class_prior("cpu", objective.settings)
    return time_to_train(step, (b.step_s(), b.compile_s), (a.step_s(), a.compile_s),
                         objective.settings.horizon_steps, spread.cv, spread.df,
                         step_level=level(b.windows or {r: [s] for r, s in b.steps.items()}))


def what_decides(ratio: Ratio | None, margin: float) -> tuple[int | None, str]:
    """An undetermined comparison: about how many more processes would decide it, and that in words. More than
    twice the processes it ran is said as such (a study's phase will not run them; ``task=compare`` can), and where
    the cold compiles' spread alone leaves it undecided no number of processes is named."""
    if ratio is None or ratio.low is None:
        return None, "no interval: measure it again"
    if out_of_reach(ratio, margin):
        floor = float(getattr(ratio, "floor_se", 0.0))
        return None, (f"more processes alone would not decide it (80 % power): the two cold compiles leave "
                      f"+-{1.96 * floor:.1%} of time to train")
    ran = processes(ratio)
    more = processes_to_decide(ratio, margin, ran)
    if more is None:
        return None, f"more than {MAX_MORE} more processes would decide"
    if more > 2 * ran:
        return more, (f"beyond this phase: over twice its {ran} processes; task=compare of the two with "
                      f"compare.processes={ran + more} would decide it")
    return more, f"about {more} more processes would decide"


def processes(ratio: Ratio) -> int:
    """The processes behind a ratio (side by side), or its rounds (one fresh process per candidate each)."""
    return int(getattr(ratio, "processes", 0) or ratio.rounds)


def candidates_of(study: Study) -> dict[str, Candidate]:
    """The confirmation's candidates by label, with the step times (and windows) of their repeats."""
    candidates: dict[str, Candidate] = {}
    for t in phase_trials(study, "confirm"):
        a = TrialRecord.of(t)
        c = candidates.setdefault(a.label, Candidate(a.label, a.candidate, a.name, a.config, a.baseline,
                                                     a.compile_s_cold))
        if (step := step_time(t)) is not None:
            c.steps[a.round] = step
            if a.method == SIDE_BY_SIDE:
                c.windows[a.round] = a.measured.step_s_windows
                if a.measured.step_cpu_s_windows:
                    c.cpu[a.round] = a.measured.step_cpu_s_windows
    return candidates


def confirmed(study: Study, objective: Objective) -> Confirmation | None:
    """The confirmation phase's answer; None when it did not run.

    A candidate whose interval straddles the margin is undetermined (with how many more processes would
    decide it) and never recommended over the leader. Gains over eager and default compile are paired
    intervals of step time (winner / baseline - 1; negative = the winner is faster) and of the objective's
    score (cold compile + horizon steps).
    """
    candidates = candidates_of(study)
    if not candidates:
        return None
    measured = [c for c in candidates.values() if c.steps]
    if len(measured) < 2:  # an interrupted phase, or every other candidate failed: nothing was raced
        return Confirmation(None, [c.row() for c in candidates.values()],
                            f"{len(measured)} candidate(s) with a completed repeat: no race (an interrupted phase "
                            "resumes when the same command runs again)")
    spread = compile_spread(study, objective.settings)

    def mean_score(c: Candidate) -> float:
        return statistics.fmean(math.log(s) for s in c.scores(objective).values())

    margin = objective.settings.tie_margin
    ratios: dict[str, Ratio | None] = {}

    def against(i: int, j: int) -> Ratio | None:
        ratios[measured[i].label] = versus(measured[i], measured[j], objective, True, spread)
        return ratios[measured[i].label]

    kept = incumbent_of(study, measured)
    decision = race([mean_score(c) for c in measured], [simplicity(c.config) for c in measured], against, margin,
                    kept)
    leader, winner = measured[decision.leader], measured[decision.winner]
    status: dict[str, Status] = {c.label: s for c, s in zip(measured, decision.status, strict=True)}  # type: ignore[misc]
    rows = []
    for c in measured:
        r = ratios.get(c.label)
        more, decide = what_decides(r, margin) if status[c.label] in ("undetermined", "faster") else (None, "")
        rows.append(c.row(status[c.label], r, more, decide))
    ties = [c for c in measured if status[c.label] in ("leader", "tied")]
    gains = {c.baseline: Gain(versus(winner, c, objective, False), versus(winner, c, objective, True, spread))
             for c in measured if c.baseline in CONFIRMED_BASELINES and c is not winner}
    compile_base = next((c for c in measured if c.baseline == "compile"), None)
    beats_compile = compile_base is not None and compile_base is not winner and (
        (g := gains.get("compile")) is not None and g.score is not None and g.score.measurable and g.score.change < 0)
    changes = [c.text(label, f"process {p}") for label, p, c in
               speed_changes({m.name or m.label: m.windows for m in measured},
                             {m.name or m.label: m.cpu for m in measured})]
    undetermined = [row for row in rows if row.status in ("undetermined", "faster")]
    return Confirmation(
        winner=next(row for row in rows if row.label == winner.label), candidates=rows, leader=leader.label,
        incumbent=measured[kept].label if kept is not None else "",
        tied_with_leader=[c.label for c in ties], tie_margin=margin, decided=decision.decided,
        compile_spread=spread, gains=gains, beats_default_compile=beats_compile,
        rounds=max(len(c.steps) for c in measured), method=method(study, "confirm"),
        windows=max(sum(map(len, c.windows.values())) for c in measured), speed_changes=changes,
        conclusion="; ".join([conclusion(winner, leader, ties, compile_base, beats_compile, margin, undetermined,
                                         kept is not None and decision.leader == kept), *changes]))


def incumbent_of(study: Study, measured: list[Candidate]) -> int | None:
    """The index in ``measured`` of the known winner the study re-verifies, if it was raced today."""
    if not (known := study.user_attrs.get(INCUMBENT)):
        return None
    ident = {t.number: TrialRecord.of(t).identity for t in study.get_trials(deepcopy=False)}
    return next((i for i, c in enumerate(measured) if ident.get(c.number) == known), None)


def conclusion(winner: Candidate, leader: Candidate, ties: list[Candidate], compile_base: Candidate | None,
               beats_compile: bool, margin: float = 0.0, undetermined: list[RaceRow] | None = None,
               kept: bool = False) -> str:
    if compile_base is None:
        lead = f"{winner.name or winner.label} leads (default compile was not raced)"
    elif beats_compile:
        lead = f"{winner.name} beats default torch.compile(model) beyond the noise"
    else:
        lead = "nothing beats default torch.compile(model) beyond the noise"
    tie = (f"; {len(ties)} candidates tie within +-{margin:.0%}, the simplest is recommended" if len(ties) > 1
           else "")
    if kept:
        lead += f"; the known winner {leader.name or leader.label} is kept: nothing beat it beyond the noise today"
    lead += tie + (f" (fastest on average: {leader.name or leader.label})" if leader is not winner and not kept
                   else "")
    for u in undetermined or []:
        lead += f"; {u.name or u.label} vs the leader is undetermined ({u.decide or 'no interval: measure it again'})"
    return lead
