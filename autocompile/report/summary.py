"""The end of a study: best configuration, speedups over the baselines, Pareto front, per-knob verdicts,
the code that applies the winner, and where to look next (MLflow UI, optuna-dashboard)."""

from __future__ import annotations

import dataclasses
import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import optuna
import yaml
from optuna.trial import TrialState

from autocompile.config.commands import measure_command
from autocompile.config.settings import Settings
from autocompile.config.space import SearchSpace
from autocompile.report.export.frameworks import write_framework_configs
from autocompile.report.export.script_snippet import run_commands, run_entries
from autocompile.report.export.snippet import snippet
from autocompile.report.findings.entry import Entry, EntryDoc, FailureGroup, FailureGroupDoc, failure_groups
from autocompile.report.findings.search_effects import (
    CompiledProgram,
    SearchNoise,
    Speedup,
    knob_effects,
    speedup,
)
from autocompile.study.phases.confirmation import Confirmation, confirmed
from autocompile.study.phases.plans import recommended as recommended_trial
from autocompile.study.phases.racing import study_noise, verdicts
from autocompile.study.records.objective import Objective
from autocompile.study.records.optuna_store import (
    EXPECTED,
    WARM_START,
    counted,
    feasible,
    interrupted,
    is_search,
    journal_file,
    measured_trials,
)
from autocompile.study.records.phase_trials import phase, phase_trials
from autocompile.study.records.record import TrialRecord
from autocompile.study.reuse import reverifies
from autocompile.study.statistics.effect import Effect
from autocompile.study.statistics.noise import Noise
from autocompile.trial.timing.compile_artifacts import WarmStart


class SummaryDoc(TypedDict):
    """``summary.json``: :attr:`Report.summary`, the report's fields as JSON."""

    study: str
    model: str
    objective: str
    horizon_steps: int
    stop_reason: str
    wall_s: float
    counts: dict[str, int]
    best: EntryDoc | None
    baselines: dict[str, EntryDoc]
    speedups: dict[str, Speedup]
    pareto: list[EntryDoc]
    effects: list[dict[str, Any]]
    """``Effect.as_dict()``, and so ``verdicts``."""
    noise: dict[str, float | int | str] | None
    search_noise: dict[str, float | str | None] | None
    confirmed: dict[str, Any] | None
    """``Confirmation.as_dict()``."""
    verdicts: list[dict[str, Any]]
    recommended: EntryDoc | None
    recommendation_changed: str
    phases_wall_s: dict[str, float]
    phases_expected_s: dict[str, float]
    warm_start: WarmStart | None
    failures: list[FailureGroupDoc]
    run_dir: str
    measure_command: str
    commands: dict[str, str]


@dataclass
class Report:
    study_name: str
    model: str
    objective: str
    horizon_steps: int
    stop_reason: str
    wall_s: float
    counts: dict[str, int]
    best: Entry | None
    baselines: dict[str, Entry]
    speedups: dict[str, Speedup]
    pareto: list[Entry]
    effects: list[Effect]
    run_dir: str = ""
    measure_command: str = ""
    commands: dict[str, str] = field(default_factory=dict)
    snippet: str = ""
    noise: Noise | None = None
    """Run-to-run noise of step time (relative sd across fresh processes) as the study measured it."""
    search_noise: SearchNoise | None = None
    """What the search's ± assume of one process: ``noise``, else a related answer's or the rules' prior."""
    confirmed: Confirmation | None = None
    """The confirmation phase: winner, candidates, paired intervals vs the baselines (None: not run)."""
    verdicts: list[Effect] = field(default_factory=list)
    """The verdict phase's verdicts (empty: not run; ``effects`` then holds the search's fallback)."""
    recommended: Entry | None = None
    """What best_config.* applies: the confirmed winner, else the search's best; a verdict neighbour that
    trains measurably faster than either replaces it."""
    recommendation_changed: str = ""
    """Why a verdict neighbour replaced the confirmed winner (empty: it did not)."""
    phases_wall_s: dict[str, float] = field(default_factory=dict)
    phases_expected_s: dict[str, float] = field(default_factory=dict)
    """What the study's estimate said each phase would take as it started (the search's and the whole study's:
    before the search), beside ``phases_wall_s`` (:func:`expected_per_phase`)."""
    warm_start: WarmStart | None = None
    warm_unmeasured: str = ""
    """Why this study measured no warm start (empty: it did, or its winner keeps no artifacts)."""
    """The winner's compile artifacts and the compile time a warm start with them saved (``warmstart``)."""
    failures: list[FailureGroup] = field(default_factory=list)
    """Measured trials that did not complete feasibly, grouped by what ended them (most frequent first)."""

    @property
    def summary(self) -> SummaryDoc:
        return {
            "study": self.study_name, "model": self.model, "objective": self.objective,
            "horizon_steps": self.horizon_steps, "stop_reason": self.stop_reason, "wall_s": self.wall_s,
            "counts": self.counts, "best": self.best.as_dict() if self.best else None,
            "baselines": {name: e.as_dict() for name, e in self.baselines.items()}, "speedups": self.speedups,
            "pareto": [e.as_dict() for e in self.pareto], "effects": [e.as_dict() for e in self.effects],
            "noise": self.noise.as_dict() if self.noise else None,
            "search_noise": dataclasses.asdict(self.search_noise) if self.search_noise else None,
            "confirmed": self.confirmed.as_dict() if self.confirmed else None,
            "verdicts": [e.as_dict() for e in self.verdicts],
            "recommended": self.recommended.as_dict() if self.recommended else None,
            "recommendation_changed": self.recommendation_changed,
            "phases_wall_s": self.phases_wall_s, "phases_expected_s": self.phases_expected_s,
            "warm_start": self.warm_start,
            "failures": [g.as_dict() for g in self.failures],
            "run_dir": self.run_dir, "measure_command": self.measure_command, "commands": self.commands,
        }


def build_report(study: optuna.Study, settings: Settings, objective: Objective, space: SearchSpace,
                 stop_reason: str, wall_s: float, run_dir: Path) -> Report:
    trials = study.get_trials(deepcopy=False)
    measured = measured_trials(study)
    complete = [Entry.of(t, objective) for t in measured if t.state == TrialState.COMPLETE and feasible(t)]
    counts = {
        "trials": sum(counted(t) for t in trials),
        "queued": sum(t.state == TrialState.WAITING and is_search(t) for t in trials),
        "measured": len(measured),
        "complete": sum(t.state == TrialState.COMPLETE for t in measured),
        "infeasible": sum(t.state == TrialState.COMPLETE for t in measured) - len(complete),
        "pruned": sum(t.state == TrialState.PRUNED for t in measured),
        "failed": sum(t.state == TrialState.FAIL for t in measured),
        "duplicates_skipped": sum(TrialRecord.of(t).duplicate_of is not None for t in trials),
        "same_program": sum(TrialRecord.of(t).same_program_as is not None for t in trials),
        "interrupted": sum(interrupted(t) for t in trials),
        "remeasured": sum(TrialRecord.of(t).remeasure_of is not None for t in measured),
        "recovered": sum(TrialRecord.of(t).remeasure_of is not None and t.state == TrialState.COMPLETE
                         for t in measured),
    }
    best = min(complete, key=lambda e: objective.score(e.result), default=None)
    baselines = {e.baseline: e for e in complete if e.baseline}
    noise = study_noise(study)
    assumed = SearchNoise.of(study, noise)
    speedups = {name: speedup(best, base, assumed) for name, base in baselines.items()} if best else {}
    verdict_effects = verdicts(study, objective)
    outcome = confirmed(study, objective)
    recommended = best
    chosen, changed = recommended_trial(study, objective)
    if chosen is not None and ((outcome and outcome.winner) or changed):
        recommended = Entry.of(chosen, objective)
    counts |= {f"{p}_repeats": len(phase_trials(study, p)) for p in ("confirm", "verdict")}
    report = Report(
        study_name=study.study_name, model=settings.model.name, objective=objective.kind,
        horizon_steps=settings.objective.horizon_steps, stop_reason=stop_reason, wall_s=wall_s, counts=counts,
        best=best, baselines=baselines, speedups=speedups, pareto=pareto_front(complete),
        effects=verdict_effects or knob_effects(complete, compiled_programs(trials), assumed), run_dir=str(run_dir),
        commands=look_commands(settings, run_dir) | run_commands(settings, run_dir), confirmed=outcome,
        noise=noise, search_noise=assumed, verdicts=verdict_effects, recommended=recommended,
        recommendation_changed=changed, phases_wall_s=phases_wall(trials),
        phases_expected_s=expected_per_phase(study.user_attrs.get(EXPECTED) or {}),
        failures=failure_groups(measured, complete),
    )
    if recommended is not None:
        warm = study.user_attrs.get(WARM_START)  # measured by the study (study.warmstart) for this winner
        report.warm_start = warm if warm and warm.get("trial") == recommended.number else None
        report.warm_unmeasured = ("a re-verification measures the known answer's programs briefly; the study it "
                                  "re-verifies measured it" if reverifies(study) else "study.warm_start=false"
                                  if not settings.study.warm_start else "")
        threads = (recommended.result.environment or {}).get("threads")
        report.measure_command = measure_command(settings, recommended.config, threads)
        report.snippet = snippet(settings, recommended, space, report.measure_command, run_dir)
    return report


def expected_per_phase(kept: dict[str, dict[str, float]]) -> dict[str, float]:
    """Each phase's expected seconds as it started (``study.estimate.remember``): the search's before it, the
    confirmation's after the search, the verdicts' after the confirmation (or after the search without one);
    ``total``: the whole study's, before the search."""
    before, after_search = kept.get("before_search") or {}, kept.get("after_search") or {}
    verdict = (kept.get("after_confirm") or after_search).get("verdict")
    found = {"search": before.get("search"), "confirm": after_search.get("confirm"), "verdict": verdict,
             "total": before.get("total")}
    return {k: v for k, v in found.items() if v}


def expected_line(expected: dict[str, float], walls: dict[str, float], wall_s: float) -> str:
    """``Estimated as each phase started: search 410 s (x1.03 its wall), ...``: how far the estimate was off."""
    actual = {**walls, "total": wall_s}
    parts = [f"{k} {v:.0f} s" + (f" (x{v / actual[k]:.2f} its wall)" if actual.get(k) else "")
             for k, v in expected.items() if k in actual]
    return ("Estimated as each phase started (the whole study: before the search): " + ", ".join(parts)) \
        if parts else ""


def phases_wall(trials: list[optuna.trial.FrozenTrial]) -> dict[str, float]:
    """Seconds from the first trial's start to the last one's end, per phase (search, confirm, verdict)."""
    spans: dict[str, list[float]] = {}
    for t in trials:
        if t.datetime_start and t.datetime_complete:
            span = spans.setdefault(phase(t), [math.inf, -math.inf])
            span[0] = min(span[0], t.datetime_start.timestamp())
            span[1] = max(span[1], t.datetime_complete.timestamp())
    return {name: end - start for name, (start, end) in spans.items()}


def compiled_programs(trials: list[optuna.trial.FrozenTrial]) -> list[CompiledProgram]:
    """Configuration and fingerprint of every trial that compiled something and got its values,
    those stopped as the same program as an earlier trial included."""
    records = [TrialRecord.of(t) for t in trials if t.state == TrialState.COMPLETE]
    return [{"config": r.config, "fingerprint": r.measured.fingerprint} for r in records
            if r.config and r.measured.fingerprint and (r.duplicate_of is None or r.same_program_as is not None)]


def look_commands(settings: Settings, run_dir: Path) -> dict[str, str]:
    journal = journal_file(settings.study.storage, run_dir)  # optuna-dashboard takes a journal file's path
    storage = str(journal) if journal is not None else settings.study.storage
    commands = {"optuna-dashboard (pip install optuna-dashboard)": f"optuna-dashboard {shlex.quote(storage)}"}
    if settings.tracking.enabled:
        commands["MLflow UI"] = f"mlflow ui --backend-store-uri {shlex.quote(settings.tracking_uri)} --port 5000"
    return commands


def pareto_front(entries: list[Entry]) -> list[Entry]:
    """Trials no other beats on both throughput (up) and compile time (down), fastest compile first."""
    def point(e: Entry) -> tuple[float, float]:
        return e.result.tokens_per_s, e.result.compile_s

    front = [e for e in entries if not any(
        point(o)[0] >= point(e)[0] and point(o)[1] <= point(e)[1] and point(o) != point(e) for o in entries)]
    return sorted(front, key=lambda e: e.result.compile_s)


def write_artifacts(report: Report, run_dir: Path) -> None:
    (run_dir / "summary.json").write_text(json.dumps(report.summary, indent=2, default=str))
    chosen = report.recommended
    if chosen is None:
        return
    won = report.confirmed.winner if report.confirmed else None
    (run_dir / "best_config.yaml").write_text(yaml.safe_dump(
        {"study": report.study_name, "trial": chosen.number, "knobs": chosen.config,
         "decided_by": ("verdict phase: " + report.recommendation_changed if report.recommendation_changed else
                        "confirmation repeats" if won else "search (one measurement each)"),
         **({"conclusion": report.confirmed.conclusion} if report.confirmed and won else {}),
         "measure_command": report.measure_command, **run_entries(report.commands)}, sort_keys=False))
    (run_dir / "best_config.py").write_text(report.snippet)
    write_framework_configs(report, run_dir)
