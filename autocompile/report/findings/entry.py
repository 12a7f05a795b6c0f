"""A measured trial as the report shows it: the best, the baselines, the Pareto front, the recommendation;
and the measured trials that did not complete feasibly, grouped by what ended them.

``summary.json`` holds these as dicts (:meth:`Entry.as_dict`, :meth:`FailureGroup.as_dict`); the report, MLflow's
study note and the snippet read the typed entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypedDict

from optuna.trial import FrozenTrial, TrialState

from autocompile.config.choices import Knobs
from autocompile.study.records.objective import Objective
from autocompile.study.records.record import Measurement, TrialRecord


class EntryDoc(TypedDict):
    """An :class:`Entry` in ``summary.json`` (``best``, ``baselines``, ``pareto``, ``recommended``)."""

    number: int
    name: str
    config: Knobs
    baseline: str | None
    result: dict[str, Any]
    """``Measurement.to_dict()``: the measurement's fields that are set."""
    time_to_train_s: float
    trial_dir: str | None


@dataclass
class Entry:
    """One complete, measured trial of the search."""

    number: int
    """Its Optuna trial number."""
    name: str
    """Its knobs that differ from the defaults, for people."""
    config: Knobs
    """Its active knobs, by dotted key (what ``best_config.*`` applies)."""
    baseline: str | None
    """``eager``, ``compile``... when it is a queued baseline."""
    result: Measurement
    """What it measured."""
    time_to_train_s: float
    """Compile plus ``objective.horizon_steps`` steps, in seconds."""
    trial_dir: str | None
    """Where it ran (logs, result.json, compile artifacts)."""

    @classmethod
    def of(cls, trial: FrozenTrial, objective: Objective) -> Entry:
        record = TrialRecord.of(trial)
        return cls(trial.number, record.name, record.config, record.baseline, record.measured,
                   objective.time_to_train(record.measured), record.trial_dir)

    def as_dict(self) -> EntryDoc:
        """As ``summary.json`` keeps it."""
        return {"number": self.number, "name": self.name, "config": self.config, "baseline": self.baseline,
                "result": self.result.to_dict(), "time_to_train_s": self.time_to_train_s,
                "trial_dir": self.trial_dir}


class FailureGroupDoc(TypedDict):
    """A :class:`FailureGroup` in ``summary.json``'s ``failures``."""

    outcome: str
    reason: str
    trials: list[int]


@dataclass(frozen=True)
class FailureGroup:
    """Measured trials that did not complete feasibly for one reason."""

    outcome: str
    """``infeasible``, ``pruned``, or the failure's kind (``oom``, ``crash``...)."""
    reason: str
    trials: list[int]

    def as_dict(self) -> FailureGroupDoc:
        """As ``summary.json`` keeps it."""
        return {"outcome": self.outcome, "reason": self.reason, "trials": list(self.trials)}


def failure_groups(measured: list[FrozenTrial], complete: list[Entry]) -> list[FailureGroup]:
    """What ended the measured trials that did not complete feasibly: one group per (outcome, reason)."""
    feasible_numbers = {e.number for e in complete}
    groups: dict[tuple[str, str], list[int]] = {}
    for t in measured:
        if t.number in feasible_numbers:
            continue
        record = TrialRecord.of(t)
        if t.state == TrialState.COMPLETE:
            kind = "infeasible"
            why = ", ".join(f"{k} over its limit" for k, v in (record.constraints or {}).items() if v > 0)
            why = why or record.numerics or ""
        else:
            kind = "pruned" if t.state == TrialState.PRUNED else record.measured.failure or "failed"
            why = record.reason or record.measured.reason or ""
        groups.setdefault((kind, " ".join(why.split())[:300]), []).append(t.number)
    return [FailureGroup(kind, why, numbers)
            for (kind, why), numbers in sorted(groups.items(), key=lambda g: -len(g[1]))]
